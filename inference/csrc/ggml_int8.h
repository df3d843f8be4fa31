// Products of x rounded to 8 bits with the K-quant blocks (Q4_K, Q5_K, Q6_K) as stored, in the form
// of llama.cpp's own vec_dot_q*_K_q8_K: x is rounded per super-block of 256 (one scale, as
// block_q8_K), the weights' small unsigned integers multiply x's int8 values byte by byte (maddubs:
// pairs summed into 16 bits), each pair sum is multiplied by its sub-block's integer scale and summed
// into 32 bits (madd, or AVX-512 VNNI's dpwssd), so that a whole super-block is summed exactly in
// integers; then one float multiply-add by d * dx per super-block.  Included by ggml_blocks.cpp inside
// a namespace that defines Dot16::add(acc, a, b) (acc + the sums of a * b's pairs of 16-bit lanes)
// and Dot16::ACCUMULATORS (independent chains a tile keeps), under that namespace's target; 256-bit vectors in both (on the CPUs with VNNI we know, 512-bit
// integer operations run as two 256-bit halves: these tiles would gain nothing from them; the panels
// of ggml_panels.h use them for fewer instructions).  No include guard, on purpose.
//
// A tile of ROWS rows of x against COLS weight rows keeps ROWS * COLS integer and float accumulators
// in registers: each weight group is decoded once for ROWS rows, each x group loaded once for COLS.
// The K-quants' minimums multiply x's exact float sums per 32; Q6_K's offset of 32 multiplies the
// rounded values' sums per 16 (so that the centred weight meets x's rounding), in integers.  The
// likelihood cost is measured by bench/activation_bits_quality.py (docs/performance.md).

constexpr int SUPER = 256;

// x [M, K] rounded per 256: q int8 [M, K] (round(x / dx) to nearest even, |q| <= 127), dx [M, K / 256]
// (max |x| / 127), sx [M, K / 32] (x's float sums), q16 [M, K / 16] (q's sums).  false where a scale
// would be subnormal or x holds an infinity or a NaN (float32 products then, where they propagate).
struct RoundedX8 {
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  std::vector<int16_t> q16;

  bool round(const float* x, int64_t M, int64_t K) {
    const int64_t blocks = M * K / SUPER;
    q.resize(static_cast<size_t>(M * K));
    dx.resize(static_cast<size_t>(blocks));
    sx.resize(static_cast<size_t>(blocks * 8));
    q16.resize(static_cast<size_t>(blocks * 16));
    bool representable = true;
    for (int64_t i = 0; i < blocks; ++i)
      representable &= round_block(x + i * SUPER, &q[i * SUPER], &dx[i], &sx[i * 8], &q16[i * 16]);
    return representable;
  }

 private:
  static int32_t sum_lanes(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
  }

  static bool round_block(const float* x, int8_t* q, float* dx, float* sx, int16_t* q16) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < SUPER / 8; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float biggest = _mm_cvtss_f32(m4), d = biggest / 127.0f;
    bool representable = d >= FLT_MIN || biggest == 0.0f;
    const float inverse = d >= FLT_MIN ? 1.0f / d : 0.0f;
    *dx = inverse > 0.0f ? d : 0.0f;
    const __m256 id = _mm256_set1_ps(inverse);
    for (int g = 0; g < SUPER / GROUP; ++g) {
      __m256 sum = _mm256_setzero_ps();
      __m256i v[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 value = _mm256_loadu_ps(x + GROUP * g + 8 * i);
        sum = _mm256_add_ps(sum, value);
        v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(value, id));  // to nearest even
      }
      sx[g] = kernels::horizontal_sum(sum);
      representable &= std::isfinite(sx[g]);
      q16[2 * g] = static_cast<int16_t>(sum_lanes(_mm256_add_epi32(v[0], v[1])));
      q16[2 * g + 1] = static_cast<int16_t>(sum_lanes(_mm256_add_epi32(v[2], v[3])));
      // int32 -> int16 -> int8 packs work within 128-bit lanes: put the bytes back in order after.
      const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + GROUP * g),
                          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    return representable;
  }
};

// A weight row's bytes a super-block of 256 weights.
constexpr int64_t int8_block_bytes(int type) { return type == TYPE_Q4_K ? 144 : type == TYPE_Q5_K ? 176 : 210; }

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline void prefetch_block(const uint8_t* b, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(b + PREFETCH_BYTES + line), _MM_HINT_T0);
}

// The tile's accumulators: per (row, column) CHAINS sets of 8 int32 lanes for the current
// super-block (independent chains, where the integer multiply-add's latency would otherwise bound a
// small tile: Dot16::ACCUMULATORS in flight) and 8 float lanes for the row's sum so far.
template <int ROWS, int COLS>
struct Tile {
  static constexpr int CHAINS = Dot16::ACCUMULATORS > ROWS * COLS ? Dot16::ACCUMULATORS / (ROWS * COLS) : 1;
  __m256i sums[ROWS][COLS][CHAINS];
  __m256 acc[ROWS][COLS];
  Tile() {
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < COLS; ++c) {
        for (int k = 0; k < CHAINS; ++k) sums[r][c][k] = _mm256_setzero_si256();
        acc[r][c] = _mm256_setzero_ps();
      }
  }
  // Group g's products of row r and column c, a * b's pairs summed (Dot16).
  void add(int r, int c, int g, __m256i a, __m256i b) { sums[r][c][g % CHAINS] = Dot16::add(sums[r][c][g % CHAINS], a, b); }
  // The super-block's integer sums times dx, then d (never d * dx, which can underflow where each is
  // normal), into the float sums.
  void close_block(const RoundedX8& x, int64_t r0, int64_t block, const float (&d)[COLS], int64_t blocks) {
    for (int r = 0; r < ROWS; ++r) {
      const __m256 dx = _mm256_set1_ps(x.dx[(r0 + r) * blocks + block]);
      for (int c = 0; c < COLS; ++c) {
        __m256i total = sums[r][c][0];
        for (int k = 1; k < CHAINS; ++k) total = _mm256_add_epi32(total, sums[r][c][k]);
        acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(total), dx), _mm256_set1_ps(d[c]), acc[r][c]);
        for (int k = 0; k < CHAINS; ++k) sums[r][c][k] = _mm256_setzero_si256();
      }
    }
  }
  void store(float* y, int64_t N, int64_t r0, int64_t n0, bool add) {
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < COLS; ++c) {
        float& target = y[(r0 + r) * N + n0 + c];
        const float sum = kernels::horizontal_sum(acc[r][c]);
        target = add ? target + sum : sum;
      }
  }
};

// Q4_K's and Q5_K's 6-bit scales and minimums of a super-block (k_scale_words), as 8 16-bit lanes each.
inline void k_scales16(const uint8_t* b, __m128i& sc, __m128i& m) {
  uint64_t scales, minimums;
  k_scale_words(b, scales, minimums);
  sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(scales)));
  m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(minimums)));
}

// 16-bit lane g of both halves of v in every lane (g a constant once the caller's loop is unrolled).
inline __m256i lane16(__m256i v, int g) {
  return _mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<int16_t>((2 * g) | ((2 * g + 1) << 8))));
}

// Q4_K (FIFTH false) and Q5_K: 32 bytes of qs hold groups 2j (low nibbles) and 2j + 1 (high), Q5_K's
// qh bit g of byte i bit 4 of group g's weight i; w = (d sc) q - (dmin m).  Rows r0 .. r0 + ROWS of x
// against weight rows n0 .. n0 + COLS, all of K.
template <bool FIFTH, int ROWS, int COLS>
inline void k_quant_tile(const uint8_t* w, int64_t row_bytes, const RoundedX8& x, int64_t r0, int64_t n0, int64_t K,
                         int64_t N, float* y, bool add) {
  constexpr int64_t BYTES = FIFTH ? 176 : 144;
  constexpr int QS = FIFTH ? 48 : 16;
  const int64_t blocks = K / SUPER;
  const __m256i nibble = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  Tile<ROWS, COLS> tile;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b[COLS];
    float d[COLS];
    __m256i scales[COLS];
    for (int c = 0; c < COLS; ++c) {
      b[c] = w + (n0 + c) * row_bytes + blk * BYTES;
      prefetch_block(b[c], BYTES);
      d[c] = half_to_float(b[c]);
      __m128i sc, m;
      k_scales16(b[c], sc, m);
      scales[c] = _mm256_broadcastsi128_si256(sc);
      // The minimums: - dmin m_g times x's float sum of group g, a lane each.
      const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(m)), _mm256_set1_ps(half_to_float(b[c] + 2)));
      for (int r = 0; r < ROWS; ++r)
        tile.acc[r][c] = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(&x.sx[((r0 + r) * blocks + blk) * 8]), tile.acc[r][c]);
    }
    #pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m256i low[COLS], high[COLS], scale_low[COLS], scale_high[COLS];
      for (int c = 0; c < COLS; ++c) {
        const __m256i bytes = load32(b[c] + QS + 32 * j);
        low[c] = _mm256_and_si256(bytes, nibble);
        high[c] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
        if constexpr (FIFTH) {
          const __m256i qh = load32(b[c] + 16);
          low[c] = _mm256_or_si256(low[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
          high[c] = _mm256_or_si256(high[c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
        }
        scale_low[c] = lane16(scales[c], 2 * j);
        scale_high[c] = lane16(scales[c], 2 * j + 1);
      }
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* xg = x.q.data() + (r0 + r) * K + blk * SUPER + 64 * j;
        const __m256i xl = load32(xg), xh = load32(xg + 32);
        for (int c = 0; c < COLS; ++c) {
          tile.add(r, c, 2 * j, _mm256_maddubs_epi16(low[c], xl), scale_low[c]);
          tile.add(r, c, 2 * j + 1, _mm256_maddubs_epi16(high[c], xh), scale_high[c]);
        }
      }
    }
    tile.close_block(x, r0, blk, d, blocks);
  }
  tile.store(y, N, r0, n0, add);
}

// Q6_K: ql (128 bytes), qh (64), 16 int8 scales, d.  Group g = 4 h + j: low 4 bits from
// ql[64 h + 32 (j % 2) + i] (low nibble for j < 2, high for j >= 2), bits 4-5 from bits 2 j, 2 j + 1 of
// qh[32 h + i]; w = (d sc) (q - 32), sc per 16 weights (maddubs' lanes 0-7 of a group, then 8-15).
template <int ROWS, int COLS>
inline void q6_k_tile(const uint8_t* w, int64_t row_bytes, const RoundedX8& x, int64_t r0, int64_t n0, int64_t K, int64_t N,
                      float* y, bool add) {
  constexpr int64_t BYTES = 210;
  const int64_t blocks = K / SUPER;
  const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  Tile<ROWS, COLS> tile;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b[COLS];
    float d[COLS];
    alignas(32) int16_t scales[COLS][16];
    for (int c = 0; c < COLS; ++c) {
      b[c] = w + (n0 + c) * row_bytes + blk * BYTES;
      prefetch_block(b[c], BYTES);
      d[c] = half_to_float(b[c] + 208);
      const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[c] + 192)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(scales[c]), sc);
      // The offset: - 32 sc_s times the sum of x's rounded values s, in integers.
      for (int r = 0; r < ROWS; ++r) {
        const __m256i sums = _mm256_madd_epi16(sc, load32(&x.q16[((r0 + r) * blocks + blk) * 16]));
        tile.sums[r][c][0] = _mm256_sub_epi32(tile.sums[r][c][0], _mm256_slli_epi32(sums, 5));
      }
    }
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const int g = 4 * h + j;
        __m256i q[COLS], scale[COLS];
        for (int c = 0; c < COLS; ++c) {
          const __m256i ql = load32(b[c] + 64 * h + 32 * (j % 2)), qh = load32(b[c] + 128 + 32 * h);
          const __m256i bits = j < 2 ? _mm256_and_si256(ql, nibble) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), nibble);
          const __m256i upper = j == 0 ? _mm256_slli_epi16(qh, 4) : j == 1 ? _mm256_slli_epi16(qh, 2) : j == 2 ? qh : _mm256_srli_epi16(qh, 2);
          q[c] = _mm256_or_si256(bits, _mm256_and_si256(upper, top));
          scale[c] = _mm256_set_m128i(_mm_set1_epi16(scales[c][2 * g + 1]), _mm_set1_epi16(scales[c][2 * g]));
        }
        for (int r = 0; r < ROWS; ++r) {
          const __m256i xg = load32(x.q.data() + (r0 + r) * K + blk * SUPER + GROUP * g);
          for (int c = 0; c < COLS; ++c) tile.add(r, c, g, _mm256_maddubs_epi16(q[c], xg), scale[c]);
        }
      }
    }
    tile.close_block(x, r0, blk, d, blocks);
  }
  tile.store(y, N, r0, n0, add);
}

template <int ROWS, int COLS>
inline void int8_tile(int type, const uint8_t* w, int64_t row_bytes, const RoundedX8& x, int64_t r0, int64_t n0, int64_t K,
                      int64_t N, float* y, bool add) {
  switch (type) {
    case TYPE_Q4_K: k_quant_tile<false, ROWS, COLS>(w, row_bytes, x, r0, n0, K, N, y, add); return;
    case TYPE_Q5_K: k_quant_tile<true, ROWS, COLS>(w, row_bytes, x, r0, n0, K, N, y, add); return;
    default: q6_k_tile<ROWS, COLS>(w, row_bytes, x, r0, n0, K, N, y, add); return;
  }
}

// Rows r0 .. r0 + rows (at most INT8_ROWS) of x against weight rows n0 .. n0 + COLS.
template <int COLS>
inline void int8_cols(int type, const uint8_t* w, int64_t row_bytes, const RoundedX8& x, int64_t r0, int64_t rows, int64_t n0,
                      int64_t K, int64_t N, float* y, bool add) {
  switch (rows) {
    case 1: int8_tile<1, COLS>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
    case 2: int8_tile<2, COLS>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
    case 3: int8_tile<3, COLS>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
    case 4: int8_tile<4, COLS>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
  }
  if constexpr (INT8_ROWS > 4 && COLS == 1) {
    switch (rows) {
      case 5: int8_tile<5, 1>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
      case 6: int8_tile<6, 1>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
      case 7: int8_tile<7, 1>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
      default: int8_tile<8, 1>(type, w, row_bytes, x, r0, n0, K, N, y, add); return;
    }
  }
}

inline bool has_int8_form(int type) {
  return type == TYPE_Q4_K || type == TYPE_Q5_K || type == TYPE_Q6_K || type == TYPE_Q4_K_X8;
}

// Weight rows a thread multiplies by every row of x before the next ones (they stay in L2).
constexpr int64_t INT8_WEIGHT_ROWS = 32;

// The calling thread's rounded x, reused from call to call; the workers take it by reference.
inline RoundedX8& callers_x() {
  thread_local RoundedX8 rounded;
  return rounded;
}

#include "ggml_interleaved.h"

// Weight rows [first, last) of a type of has_int8_form against every row of x, already rounded, in
// tiles of INT8_ROWS rows of x by INT8_COLS weight rows (or one, past 4 rows); y's rows ldy apart.
inline void int8_rows(int type, const uint8_t* w, int64_t K, const RoundedX8& rounded, int64_t M, int64_t first,
                      int64_t last, float* y, int64_t ldy, bool add) {
  if (type == TYPE_Q4_K_X8) {
    x8_row_range(w, K, rounded, M, first, last, y, ldy, add);
    return;
  }
  const int64_t row_bytes = K / SUPER * int8_block_bytes(type);
  for (int64_t start = first; start < last; start += INT8_WEIGHT_ROWS) {
    const int64_t end = std::min(last, start + INT8_WEIGHT_ROWS);
    for (int64_t r0 = 0; r0 < M; r0 += INT8_ROWS) {
      const int64_t rows = std::min<int64_t>(M - r0, INT8_ROWS);
      int64_t n = start;
      // Few rows of x keep one weight row's chains in flight, and more than 4 fill the registers
      // alone: wider tiles there only spill.
      if (rows > 2 && rows <= 4)
        for (; n + INT8_COLS <= end; n += INT8_COLS) int8_cols<INT8_COLS>(type, w, row_bytes, rounded, r0, rows, n, K, ldy, y, add);
      for (; n < end; ++n) int8_cols<1>(type, w, row_bytes, rounded, r0, rows, n, K, ldy, y, add);
    }
  }
}

// y[M, N] (+)= x[M, K] @ W^T for a type of has_int8_form and any M (a row is rounded alone, so its
// integer sums do not depend on the batch; the panels' products of more rows, ggml_panels.h's and
// ggml_panels_avx2.h's, sum the floats in another order); false, nothing computed, where x cannot
// be rounded (RoundedX8).
inline bool int8_gemm(int type, const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N, float* y, bool add,
                      int threads) {
  RoundedX8& rounded = callers_x();
  if (!rounded.round(x, M, K)) return false;
  kernels::parallel_for(N, threads, [&](int64_t first, int64_t last) { int8_rows(type, w, K, rounded, M, first, last, y, N, add); });
  return true;
}

// y[M, width] (+)= x[M, K] @ [W_0; W_1; ...]^T, the parts' outputs side by side (a layer's q, k and
// v, or gate and up), each part of has_int8_form: one parallel region over all their weight rows,
// x rounded once; a region's start and its barrier cost as much as a few microseconds of reading
// weights.  width: the sum of Ns.  false, nothing computed, where x cannot be rounded.
inline bool int8_gemm_parts(int parts, const int* types, const uint8_t* const* ws, const int64_t* Ns, const float* x,
                            int64_t M, int64_t K, float* y, int64_t width, bool add, int threads) {
  RoundedX8& rounded = callers_x();
  if (!rounded.round(x, M, K)) return false;
  kernels::parallel_for(width, threads, [&](int64_t first, int64_t last) {
    int64_t column = 0;
    for (int p = 0; p < parts && column < last; column += Ns[p], ++p) {
      const int64_t begin = std::max(first, column), end = std::min(last, column + Ns[p]);
      if (begin < end) int8_rows(types[p], ws[p], K, rounded, M, begin - column, end - column, y + column, width, add);
    }
  });
  return true;
}

// The panels' float accumulators (ggml_panels.h, ggml_panels_avx2.h), ROWS rows of x by VECTORS
// vectors of the namespace's V, a weight row a lane: the current super-block's sum (in units of x's
// rounded values) and the total so far.
template <int ROWS, int VECTORS>
struct PanelSums {
  typename V::F total[ROWS][VECTORS], partial[ROWS][VECTORS];
  PanelSums() {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < VECTORS; ++v) total[r][v] = partial[r][v] = V::zero();
  }
  // The super-block's sum times x's scale dx into the total.
  void close_block(const RoundedX8& x, int64_t r0, int64_t block, int64_t blocks) {
    for (int r = 0; r < ROWS; ++r) {
      const typename V::F dx = V::set1(x.dx[(r0 + r) * blocks + block]);
      for (int v = 0; v < VECTORS; ++v) {
        total[r][v] = V::fmadd(partial[r][v], dx, total[r][v]);
        partial[r][v] = V::zero();
      }
    }
  }
  // y[r0 + r, n0 .. n0 + VECTORS * V::LANES) (+)= the totals.
  void store(float* y, int64_t N, int64_t r0, int64_t n0, bool add) const {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < VECTORS; ++v) {
        float* target = y + (r0 + r) * N + n0 + v * V::LANES;
        V::store(target, add ? V::add(V::load(target), total[r][v]) : total[r][v]);
      }
  }
};
