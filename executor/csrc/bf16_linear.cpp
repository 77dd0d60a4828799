// x W^T for bfloat16 activations x (M, K) on a bfloat16 weight W (N, K) packed for VDPBF16PS, on CPUs with
// AVX512-BF16.
//
// Why: one decoding step reads every weight once for 1-8 rows of activations, so the product is bound by
// reading the weights. oneDNN's inner product costs a fixed ~20-25 us a call, 2.4-3 ms over SmolLM2's 120
// layer products a token (docs/benchmarks/model_forward.md).
//
// Layout: packed[b][p][j][t] = W[16 b + j][2 p + t] (rows padded to a multiple of 16 with zeros, K even), so one
// 64-byte load holds the k-pair p of 16 output rows, and VDPBF16PS against the broadcast pair (x[2p], x[2p+1])
// adds both products to each row's float32 accumulator: no horizontal sums. Each thread streams its share of
// the blocks; each output is rounded to bfloat16 once (round to nearest even), as oneDNN rounds its float32
// accumulator. Output lane j of block b is always one sum over p in increasing order, whatever M is: an n-token
// verification pass projects bitwise as n one-token passes do.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstring>

#include "row_chunks.h"

namespace {

// G blocks of 16 rows share each pass over k, for C activation rows (C * G accumulators; row_chunks.h).
template <int G, int C>
void group_kernel(const at::BFloat16* packed, const at::BFloat16* x, at::BFloat16* y, int64_t pairs, int64_t K,
           int64_t N, int64_t b0, int64_t blocks, int64_t m0) {
  __m512 acc[C][G];
  for (int m = 0; m < C; ++m)
    for (int g = 0; g < G; ++g) acc[m][g] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh weights[G];
    for (int g = 0; g < G; ++g)
      weights[g] = (b0 + g < blocks) ? (__m512bh)_mm512_loadu_si512(packed + ((b0 + g) * pairs + p) * 32)
                                     : (__m512bh)_mm512_setzero_si512();
    for (int m = 0; m < C; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + (m0 + m) * K + 2 * p, sizeof(pair));
      const __m512bh xs = (__m512bh)_mm512_set1_epi32(pair);
      for (int g = 0; g < G; ++g) acc[m][g] = _mm512_dpbf16_ps(acc[m][g], weights[g], xs);
    }
  }
  for (int m = 0; m < C; ++m)
    for (int g = 0; g < G; ++g) {
      const int64_t n0 = (b0 + g) * 16;
      if (n0 >= N) break;
      const __mmask16 mask = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
      _mm256_mask_storeu_epi16(y + (m0 + m) * N + n0, mask, (__m256i)_mm512_cvtneps_pbh(acc[m][g]));
    }
}

// group = G, the blocks that share each pass (4 or 6; row_chunks.h).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, int64_t group) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "bf16_linear: x and the packed weight must be bfloat16");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == 16 && packed.size(3) == 2 && packed.is_contiguous(),
              "bf16_linear: the weight must be packed as (N/16, K/2, 16, 2), got ", packed.sizes());
  const int64_t blocks = packed.size(0), pairs = packed.size(1), K = 2 * pairs, N = out_features;
  TORCH_CHECK(x.size(-1) == K && N <= 16 * blocks && N > 16 * (blocks - 1), "bf16_linear: shapes ", x.sizes(),
              " and ", packed.sizes(), " (", N, " outputs) do not multiply");
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const auto* wp = packed.data_ptr<at::BFloat16>();
  const auto* xp = rows.data_ptr<at::BFloat16>();
  auto* yp = y.data_ptr<at::BFloat16>();
  specbound_native::with_group(group, [&](auto blocks_per_pass) {
    constexpr int G = decltype(blocks_per_pass)::value;
    specbound_native::for_each_group<G>(blocks, M, [&](int64_t b0, int64_t m0, auto count) {
      group_kernel<G, decltype(count)::value>(wp, xp, yp, pairs, K, N, b0, blocks, m0);
    });
  });
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(specbound_native, m) {
  m.def("bf16_linear(Tensor x, Tensor packed, int out_features, int group=4) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbound_native, CPU, m) { m.impl("bf16_linear", &bf16_linear); }
