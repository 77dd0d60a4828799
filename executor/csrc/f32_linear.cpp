// x W^T for float32 activations x (M, K) on a float32 weight W (N, K) packed 16 rows wide, on CPUs with AVX-512.
//
// The float32 twin of bf16_linear.cpp (see there for why): packed[b][k][j] = W[16 b + j][k] (rows padded to a
// multiple of 16 with zeros), so one 64-byte load holds input k of 16 output rows, and one FMA against the
// broadcast x[k] adds it to each row's accumulator: no horizontal sums, no fixed cost per call. Output lane j of
// block b is always one sum over k in increasing order, whatever M is: an n-token verification pass projects
// bitwise as n one-token passes do.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "row_chunks.h"

namespace {

// G blocks of 16 rows share each pass over k, for C activation rows (C * G accumulators; row_chunks.h).
template <int G, int C>
void group_kernel(const float* packed, const float* x, float* y, int64_t K, int64_t N, int64_t b0, int64_t blocks,
           int64_t m0) {
  __m512 acc[C][G];
  for (int m = 0; m < C; ++m)
    for (int g = 0; g < G; ++g) acc[m][g] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 weights[G];
    for (int g = 0; g < G; ++g)
      weights[g] = (b0 + g < blocks) ? _mm512_loadu_ps(packed + ((b0 + g) * K + k) * 16) : _mm512_setzero_ps();
    for (int m = 0; m < C; ++m) {
      const __m512 xs = _mm512_set1_ps(x[(m0 + m) * K + k]);
      for (int g = 0; g < G; ++g) acc[m][g] = _mm512_fmadd_ps(weights[g], xs, acc[m][g]);
    }
  }
  for (int m = 0; m < C; ++m)
    for (int g = 0; g < G; ++g) {
      const int64_t n0 = (b0 + g) * 16;
      if (n0 >= N) break;
      const __mmask16 mask = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
      _mm512_mask_storeu_ps(y + (m0 + m) * N + n0, mask, acc[m][g]);
    }
}

// group = G, the blocks that share each pass (4 or 6; row_chunks.h).
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features, int64_t group) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "f32_linear: x and the packed weight must be float32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 16 && packed.is_contiguous(),
              "f32_linear: the weight must be packed as (N/16, K, 16), got ", packed.sizes());
  const int64_t blocks = packed.size(0), K = packed.size(1), N = out_features;
  TORCH_CHECK(x.size(-1) == K && N <= 16 * blocks && N > 16 * (blocks - 1), "f32_linear: shapes ", x.sizes(),
              " and ", packed.sizes(), " (", N, " outputs) do not multiply");
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* wp = packed.data_ptr<float>();
  const float* xp = rows.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  specbound_native::with_group(group, [&](auto blocks_per_pass) {
    constexpr int G = decltype(blocks_per_pass)::value;
    specbound_native::for_each_group<G>(blocks, M, [&](int64_t b0, int64_t m0, auto count) {
      group_kernel<G, decltype(count)::value>(wp, xp, yp, K, N, b0, blocks, m0);
    });
  });
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(specbound_native_f32, m) {
  m.def("f32_linear(Tensor x, Tensor packed, int out_features, int group=4) -> Tensor");
}
TORCH_LIBRARY_IMPL(specbound_native_f32, CPU, m) { m.impl("f32_linear", &f32_linear); }
