// Q4_K weights interleaved by 8 rows (TYPE_Q4_K_X8), multiplied by x rounded to 8 bits with a
// weight row in each 32-bit lane: the layout llama.cpp's CPU backend repacks Q4_K into at load
// (ggml-cpu's repack.cpp, block_q4_Kx8), in our own byte order.  Included by ggml_int8.h inside a
// namespace that defines Dot8 (below) under its target; no include guard, on purpose.
//
// The layout: the same bytes as the file's, rearranged.  Rows 8 g .. 8 g + 7 form group g; a group
// holds its super-blocks in order, each X8_BLOCK_BYTES (8 x 144) long:
//   [0, 16)     the 8 rows' d (float16)          [16, 32)   their dmin (float16)
//   [32, 128)   their 12 bytes of 6-bit scales and minimums, as three uint32 words a row: all
//               rows' first words, then their second, then their third
//   [128, 1152) qs: for pair p (sub-blocks 2 p and 2 p + 1) and chunk c (their weights 4 c .. 4 c + 3),
//               4 bytes a row, rows in order: row r's qs[32 p + 4 c .. + 4) (low nibbles: sub-block
//               2 p, high: 2 p + 1, as stored)
// A 32-byte load of qs is then 4 weights of 8 rows; one integer multiply-add against x's 4 values
// broadcast (AVX-512 VNNI's dpbusd, or maddubs) sums them in a row's lane, and a super-block's scales,
// minimums, d and dmin apply to 8 rows at once: about a third of the one-row tile's instructions a
// weight (k_quant_tile), and the rows' sums need no horizontal adds.  The integer sums are k_quant_tile's
// (x rounded per 256 by RoundedX8, the minimums against x's exact float sums); floats add in another
// order.
//
// Dot8 (per namespace): Acc zero(); Acc add(Acc, __m256i weights (unsigned, < 16), __m256i x (int8));
// __m256i scaled(Acc, __m256i scales) -> a lane's 32-bit sum times its 6-bit scale.

constexpr int64_t X8_BLOCK_BYTES = 8 * 144;
constexpr int64_t X8_QS = 128;

// Sub-block s's 6-bit scales (minimums: MIN) of the 8 rows, a 32-bit lane each, from the words
// u0, u1, u2 (k_scale_words' unpacking, in lanes).
template <bool MIN>
inline __m256i x8_scales(__m256i u0, __m256i u1, __m256i u2, int s) {
  const __m256i six = _mm256_set1_epi32(0x3F), nibble = _mm256_set1_epi32(0x0F), top = _mm256_set1_epi32(0x03);
  const __m256i low = MIN ? u1 : u0;
  if (s < 4) return _mm256_and_si256(_mm256_srli_epi32(low, 8 * s), six);
  const int shift = 8 * (s - 4);
  const __m256i bits = _mm256_and_si256(_mm256_srli_epi32(u2, shift + (MIN ? 4 : 0)), nibble);
  return _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(low, shift + 6), top), 4));
}

inline __m256i x8_broadcast(const int8_t* q) {
  int32_t word;
  std::memcpy(&word, q, 4);
  return _mm256_set1_epi32(word);
}

// Rows r0 .. r0 + ROWS of x against group p (8 weight rows), all of K: y[r0 + r, 0 .. 8) (+)= ...
template <int ROWS>
inline void x8_tile(const uint8_t* p, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t ldy, bool add) {
  const int64_t blocks = K / SUPER;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < blocks; ++blk, p += X8_BLOCK_BYTES) {
    for (int64_t line = 0; line < X8_BLOCK_BYTES; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + 2 * PREFETCH_BYTES + line), _MM_HINT_T0);
    const __m256i u0 = load32(p + 32), u1 = load32(p + 64), u2 = load32(p + 96);
    __m256i sums[ROWS];
    for (int r = 0; r < ROWS; ++r) sums[r] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int pair = 0; pair < 4; ++pair) {
      typename Dot8::Acc low[ROWS], high[ROWS];
      for (int r = 0; r < ROWS; ++r) low[r] = high[r] = Dot8::zero();
      #pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i bytes = load32(p + X8_QS + 32 * (8 * pair + c));
        const __m256i wl = _mm256_and_si256(bytes, nibble), wh = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* q = x.q.data() + (r0 + r) * K + blk * SUPER + 64 * pair + 4 * c;
          low[r] = Dot8::add(low[r], wl, x8_broadcast(q));
          high[r] = Dot8::add(high[r], wh, x8_broadcast(q + 32));
        }
      }
      const __m256i scale_low = x8_scales<false>(u0, u1, u2, 2 * pair), scale_high = x8_scales<false>(u0, u1, u2, 2 * pair + 1);
      for (int r = 0; r < ROWS; ++r)
        sums[r] = _mm256_add_epi32(sums[r], _mm256_add_epi32(Dot8::scaled(low[r], scale_low), Dot8::scaled(high[r], scale_high)));
    }
    __m256 minimums[ROWS];
    for (int r = 0; r < ROWS; ++r) minimums[r] = _mm256_setzero_ps();
    for (int s = 0; s < 8; ++s) {
      const __m256 m = _mm256_cvtepi32_ps(x8_scales<true>(u0, u1, u2, s));
      for (int r = 0; r < ROWS; ++r)
        minimums[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.sx[((r0 + r) * blocks + blk) * 8 + s]), minimums[r]);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    for (int r = 0; r < ROWS; ++r) {
      const __m256 dx = _mm256_set1_ps(x.dx[(r0 + r) * blocks + blk]);
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums[r]), dx), d, acc[r]);
      acc[r] = _mm256_fnmadd_ps(minimums[r], dmin, acc[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    float* target = y + (r0 + r) * ldy;
    _mm256_storeu_ps(target, add ? _mm256_add_ps(_mm256_loadu_ps(target), acc[r]) : acc[r]);
  }
}

// Groups [first, last) of a TYPE_Q4_K_X8 weight against every row of x, already rounded: a few
// groups at a time (they stay in L2) against the rows in tiles of X8_ROWS.
inline void x8_rows(const uint8_t* w, int64_t K, const RoundedX8& x, int64_t M, int64_t first, int64_t last, float* y,
                    int64_t ldy, bool add) {
  const int64_t group_bytes = K / SUPER * X8_BLOCK_BYTES;
  constexpr int64_t GROUPS = INT8_WEIGHT_ROWS / 8;
  for (int64_t start = first; start < last; start += GROUPS) {
    const int64_t end = std::min(last, start + GROUPS);
    for (int64_t r0 = 0; r0 < M;) {
      // Full tiles, then the rest in tiles of 4, 2 and 1 rows.
      const int64_t left = M - r0;
      const int rows = left >= X8_ROWS ? X8_ROWS : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      for (int64_t g = start; g < end; ++g) {
        const uint8_t* p = w + g * group_bytes;
        float* out = y + 8 * g;
        if (rows == X8_ROWS)
          x8_tile<X8_ROWS>(p, x, r0, K, out, ldy, add);
        else if (rows == 4)
          x8_tile<4>(p, x, r0, K, out, ldy, add);
        else if (rows == 2)
          x8_tile<2>(p, x, r0, K, out, ldy, add);
        else
          x8_tile<1>(p, x, r0, K, out, ldy, add);
      }
      r0 += rows;
    }
  }
}

// Weight rows [first, last) of a TYPE_Q4_K_X8 weight, a thread's share of a parallel_for over rows:
// the groups whose first row lies in it (every thread rounds alike, so the groups are shared out
// exactly once).
inline void x8_row_range(const uint8_t* w, int64_t K, const RoundedX8& x, int64_t M, int64_t first, int64_t last,
                         float* y, int64_t ldy, bool add) {
  x8_rows(w, K, x, M, (first + 7) / 8, (last + 7) / 8, y, ldy, add);
}
