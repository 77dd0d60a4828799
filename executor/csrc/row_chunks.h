// Row-count dispatch shared by the native product kernels (bf16_linear.cpp, f32_linear.cpp).
//
// A kernel keeps one accumulator per (activation row, block of 16 outputs) in registers. With the row count a
// template argument its loops over rows unroll and the accumulators stay in registers; with a run-time count
// and one 8-row kernel, 8 rows cost 11.3 ms over SmolLM2's 121 bfloat16 products against 9.7 (docs/bench.md).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace specbound_native {

// Calls kernel(std::integral_constant<int, C>{}) with C == count, for count in 1 .. 8.
template <typename Kernel>
inline void with_row_count(int64_t count, Kernel&& kernel) {
  switch (count) {
    case 1: return kernel(std::integral_constant<int, 1>{});
    case 2: return kernel(std::integral_constant<int, 2>{});
    case 3: return kernel(std::integral_constant<int, 3>{});
    case 4: return kernel(std::integral_constant<int, 4>{});
    case 5: return kernel(std::integral_constant<int, 5>{});
    case 6: return kernel(std::integral_constant<int, 6>{});
    case 7: return kernel(std::integral_constant<int, 7>{});
    default: return kernel(std::integral_constant<int, 8>{});
  }
}

// Runs group(b0, m0, C) over every group of G blocks (in parallel) and every chunk of the M rows: balanced chunks
// of at most 8 rows, each chunk one pass over the weights. G = 4 was measured best from 1 to 16 rows in both
// dtypes on an AMD Zen 4 (G <= 4 tried); 6 was faster on an Intel Xeon, so the caller chooses (with_group).
// Calls run(std::integral_constant<int, G>{}) with G == group, the blocks that share each pass: 4 or 6. Which is
// faster depends on the CPU and no output does (each is one sum over k in order); executor.products measures it.
template <typename Run>
inline void with_group(int64_t group, Run&& run) {
  TORCH_CHECK(group == 4 || group == 6, "group must be 4 or 6, got ", group);
  if (group == 6) return run(std::integral_constant<int, 6>{});
  return run(std::integral_constant<int, 4>{});
}

template <int G, typename Group>
inline void for_each_group(int64_t blocks, int64_t M, Group&& group) {
  const int64_t chunks = std::max<int64_t>((M + 7) / 8, 1), per = (M + chunks - 1) / chunks;
  at::parallel_for(0, (blocks + G - 1) / G, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t m0 = 0; m0 < M; m0 += per)
        with_row_count(std::min(per, M - m0), [&](auto count) { group(i * G, m0, count); });
  });
}

}  // namespace specbound_native
