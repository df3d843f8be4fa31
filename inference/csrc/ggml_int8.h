// Products of x rounded to 8 bits with the K-quant blocks (Q4_K, Q5_K, Q6_K) as stored,
// the form of llama.cpp's own vec_dot_q*_K_q8_K: the weights' small unsigned integers multiply x's
// int8 values byte by byte, summed in 32-bit lanes, then one float multiply-add per group of 32.
// Included by ggml_blocks.cpp inside a namespace that defines Dot8::dot(w, x) (8 int32 lanes, lane i
// the sum of bytes 4 i .. 4 i + 3's products, w unsigned and x signed: AVX2's maddubs and madd, or
// AVX-512 VNNI's dpbusd) and under that namespace's target; 256-bit vectors in both (on the CPUs with
// VNNI we know, 512-bit integer operations run as two 256-bit halves, so wider vectors gain nothing).
// No include guard, on purpose.
//
// x is rounded per group of 32 (scale dx = max |x| / 127; kernels::round_row), finer than llama.cpp's
// one scale per 256.  A group's sum over its integers times d * sc * dx is exact up to float32 rounding;
// the K-quants' minimums multiply x's exact float sums, Q6_K's offset of 32 the rounded values' sums
// (so that the centred weight, not its offset form, meets x's rounding).  The likelihood cost is
// measured by bench/activation_bits_quality.py (docs/performance.md).

// x [M, K] rounded to 8 bits (RoundedX), and for Q6_K's offset the sums of q per 16 values, as
// floats [M, K / 16].
struct RoundedX8 : RoundedX<int8_t> {
  std::vector<float> q16;
  void sum_sixteens(int64_t M, int64_t K) {
    q16.resize(static_cast<size_t>(M * K / 16));
    for (int64_t i = 0; i < M * K / 16; ++i) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += q[static_cast<size_t>(16 * i + k)];
      q16[static_cast<size_t>(i)] = static_cast<float>(sum);
    }
  }
};

// A weight row's bytes a super-block of 256 weights.
constexpr int64_t int8_block_bytes(int type) { return type == TYPE_Q4_K ? 144 : type == TYPE_Q5_K ? 176 : 210; }

template <int ROWS, int CHAINS>
inline void zero_rows(__m256 (&acc)[ROWS][CHAINS], __m256 (&offsets)[ROWS]) {
  for (int r = 0; r < ROWS; ++r) {
    offsets[r] = _mm256_setzero_ps();
    for (int c = 0; c < CHAINS; ++c) acc[r][c] = _mm256_setzero_ps();
  }
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256 int_sums(__m256i w, const int8_t* x) { return _mm256_cvtepi32_ps(Dot8::dot(w, load32(x))); }

// Independent float accumulators per row: one row's 8 multiply-adds a block would otherwise wait on
// one another.
template <int ROWS>
constexpr int int8_chains() {
  return ROWS == 1 ? 4 : 2;
}

template <int ROWS, int CHAINS>
inline void finish_rows(__m256 (&acc)[ROWS][CHAINS], const __m256 (&offsets)[ROWS], int64_t N, int64_t n, float* y, bool add) {
  for (int r = 0; r < ROWS; ++r) {
    __m256 total = offsets[r];
    for (int c = 0; c < CHAINS; ++c) total = _mm256_add_ps(total, acc[r][c]);
    float& target = y[r * N + n];
    const float sum = kernels::horizontal_sum(total);
    target = add ? target + sum : sum;
  }
}

inline void prefetch_block(const uint8_t* b, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(b + PREFETCH_BYTES + line), _MM_HINT_T0);
}

// Q4_K (FIFTH false) and Q5_K: 32 bytes of qs hold groups 2c (low nibbles) and 2c + 1 (high), Q5_K's
// qh bit g of byte i bit 4 of group g's weight i; w = (d sc) q - dmin m.
template <bool FIFTH, int ROWS>
inline void k_quant_int8_row(const uint8_t* row, const RoundedX8& x, int64_t r0, int64_t K, int64_t N, int64_t n, float* y,
                             bool add) {
  constexpr int64_t BYTES = int8_block_bytes(FIFTH ? TYPE_Q5_K : TYPE_Q4_K);
  constexpr int QS = FIFTH ? 48 : 16, CHAINS = int8_chains<ROWS>();
  const int64_t groups = K / GROUP, blocks = K / 256;
  const __m256i nibble = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc[ROWS][CHAINS], offsets[ROWS];
  zero_rows(acc, offsets);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b = row + blk * BYTES;
    prefetch_block(b, BYTES);
    const KScales s = k_scales(b);
    alignas(32) float scales[ROWS][8];  // d sc dx per group
    for (int r = 0; r < ROWS; ++r) {
      const int64_t first = (r0 + r) * groups + blk * 8;
      _mm256_store_ps(scales[r], _mm256_mul_ps(_mm256_loadu_ps(s.d), _mm256_loadu_ps(&x.dx[first])));
      offsets[r] = _mm256_fnmadd_ps(_mm256_loadu_ps(s.m), _mm256_loadu_ps(&x.sx[first]), offsets[r]);
    }
    const __m256i qh = FIFTH ? load32(b + 16) : _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes = load32(b + QS + 32 * c);
      __m256i low = _mm256_and_si256(bytes, nibble), high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
      if constexpr (FIFTH) {
        low = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        high = _mm256_or_si256(high, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      #pragma GCC unroll 4
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* xg = x.q.data() + (r0 + r) * K + blk * 256 + 64 * c;
        __m256& first = acc[r][(2 * c) % CHAINS];
        __m256& second = acc[r][(2 * c + 1) % CHAINS];
        first = _mm256_fmadd_ps(int_sums(low, xg), _mm256_set1_ps(scales[r][2 * c]), first);
        second = _mm256_fmadd_ps(int_sums(high, xg + 32), _mm256_set1_ps(scales[r][2 * c + 1]), second);
      }
    }
  }
  finish_rows<ROWS, CHAINS>(acc, offsets, N, n, y + r0 * N, add);
}

// Q6_K: ql (128 bytes), qh (64), 16 int8 scales, d.  Group g = 4 h + j: low 4 bits from
// ql[64 h + 32 (j % 2) + i] (low nibble for j < 2, high for j >= 2), bits 4-5 from bits 2 j, 2 j + 1 of
// qh[32 h + i]; w = (d sc) (q - 32), sc per 16 weights (lanes 0-3 of a group's sums, then 4-7).
template <int ROWS>
inline void q6_k_int8_row(const uint8_t* row, const RoundedX8& x, int64_t r0, int64_t K, int64_t N, int64_t n, float* y,
                          bool add) {
  constexpr int CHAINS = int8_chains<ROWS>();
  const int64_t groups = K / GROUP, blocks = K / 256;
  const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  __m256 acc[ROWS][CHAINS], offsets[ROWS];
  zero_rows(acc, offsets);
  // Lanes 0-3 take scale 2 g, lanes 4-7 scale 2 g + 1, of the 8 scales of groups g .. g + 3.
  const __m256i spread[4] = {
      _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
      _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
  const __m256i pairs_low = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), pairs_high = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b = row + blk * int8_block_bytes(TYPE_Q6_K);
    prefetch_block(b, int8_block_bytes(TYPE_Q6_K));
    const __m256 d = _mm256_set1_ps(half_to_float(b + 208));
    const __m256 sc_low = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192)))));
    const __m256 sc_high = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 200)))));
    __m256 scales[ROWS][2];  // d sc dx per 16 weights: sub-blocks 0-7, 8-15
    for (int r = 0; r < ROWS; ++r) {
      const __m256 dx = _mm256_loadu_ps(&x.dx[(r0 + r) * groups + blk * 8]);
      scales[r][0] = _mm256_mul_ps(sc_low, _mm256_permutevar8x32_ps(dx, pairs_low));
      scales[r][1] = _mm256_mul_ps(sc_high, _mm256_permutevar8x32_ps(dx, pairs_high));
      const float* q16 = &x.q16[((r0 + r) * groups + blk * 8) * 2];
      __m256 offset = _mm256_mul_ps(scales[r][0], _mm256_loadu_ps(q16));
      offset = _mm256_fmadd_ps(scales[r][1], _mm256_loadu_ps(q16 + 8), offset);
      offsets[r] = _mm256_fnmadd_ps(_mm256_set1_ps(32.0f), offset, offsets[r]);
    }
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(b + 64 * h), ql1 = load32(b + 64 * h + 32), qh = load32(b + 128 + 32 * h);
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, nibble), _mm256_and_si256(_mm256_slli_epi16(qh, 4), top)),
          _mm256_or_si256(_mm256_and_si256(ql1, nibble), _mm256_and_si256(_mm256_slli_epi16(qh, 2), top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), nibble), _mm256_and_si256(qh, top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), nibble), _mm256_and_si256(_mm256_srli_epi16(qh, 2), top))};
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        #pragma GCC unroll 4
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* xg = x.q.data() + (r0 + r) * K + blk * 256 + 32 * (4 * h + j);
          __m256& chain = acc[r][j % CHAINS];
          chain = _mm256_fmadd_ps(int_sums(q[j], xg), _mm256_permutevar8x32_ps(scales[r][h], spread[j]), chain);
        }
      }
    }
  }
  finish_rows<ROWS, CHAINS>(acc, offsets, N, n, y + r0 * N, add);
}

template <int ROWS>
inline void int8_row(int type, const uint8_t* row, const RoundedX8& x, int64_t r0, int64_t K, int64_t N, int64_t n, float* y,
                     bool add) {
  switch (type) {
    case TYPE_Q4_K: k_quant_int8_row<false, ROWS>(row, x, r0, K, N, n, y, add); return;
    case TYPE_Q5_K: k_quant_int8_row<true, ROWS>(row, x, r0, K, N, n, y, add); return;
    default: q6_k_int8_row<ROWS>(row, x, r0, K, N, n, y, add); return;
  }
}

inline bool has_int8_form(int type) { return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K; }

// y[M, N] (+)= x[M, K] @ W^T for a type of has_int8_form and any M (a row is rounded alone: its result
// does not depend on the batch), each weight row against x's rows 4 at a time (the row stays in L1
// from one to the next); false, nothing computed, where x cannot be rounded (an infinity, a NaN, a subnormal group scale: float32 then).
inline bool int8_gemm(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add,
                      int threads) {
  thread_local RoundedX8 callers;  // the caller's, reused; the workers take it by reference
  RoundedX8& rounded = callers;
  if (!rounded.round(x, M, K)) return false;
  if (type == TYPE_Q6_K) rounded.sum_sixteens(M, K);
  const int64_t row_bytes = K / 256 * int8_block_bytes(type);
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const uint8_t* row = w + n * row_bytes;
      for (int64_t r0 = 0; r0 < M; r0 += 4) {
        switch (std::min<int64_t>(M - r0, 4)) {
          case 1: int8_row<1>(type, row, rounded, r0, K, N, n, y, add); break;
          case 2: int8_row<2>(type, row, rounded, r0, K, N, n, y, add); break;
          case 3: int8_row<3>(type, row, rounded, r0, K, N, n, y, add); break;
          default: int8_row<4>(type, row, rounded, r0, K, N, n, y, add); break;
        }
      }
    }
  });
  return true;
}
