// Small AVX2 helpers shared by the kernels.
#pragma once

#include <immintrin.h>

namespace kernels {

// The sum of a vector's 8 floats.
inline float horizontal_sum(__m256 v) {
  __m128 low = _mm256_castps256_ps128(v);
  __m128 high = _mm256_extractf128_ps(v, 1);
  low = _mm_add_ps(low, high);
  low = _mm_add_ps(low, _mm_movehl_ps(low, low));
  low = _mm_add_ss(low, _mm_movehdup_ps(low));
  return _mm_cvtss_f32(low);
}

}  // namespace kernels
