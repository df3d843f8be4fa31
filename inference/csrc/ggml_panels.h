// Products of many rows of x rounded to 8 bits (RoundedX8, as ggml_int8.h rounds them) with Q4_K
// and Q6_K weights on AVX-512 VNNI's dpbusd, for prefill chunks and wide decode batches.  Included by
// ggml_blocks.cpp after ggml_int8.h inside its VNNI namespace (RoundedX8, SUPER, int8_cols and
// friends); no include guard, on purpose.
//
// ggml_int8.h multiplies the blocks as stored: each int8 multiply-add of a weight row takes a
// maddubs and a dpwssd (the sub-block scale), two instructions per 32 weights and row of x.  Here a
// panel of PANEL_COLUMNS weight rows is first decoded, by the thread that multiplies it, into the
// order of a GEMM's packed B (as oneDNN and llama.cpp's repacked tiles do): 4 consecutive weights of
// 16 weight rows a 512-bit vector, gathered a 32-bit word of each row at a time, so that one dpbusd
// multiplies them by 4 bytes of x broadcast, 64 multiply-adds, each of the 16 lanes its own weight
// row.  A sub-block's sums then leave the integers: times d sc in float (a lane a weight row), with
// the minimums (Q4_K: dmin m times x's float sums per 32) or the offset (Q6_K: 32 d sc times x's
// rounded sums per 16), and the super-block's sum times x's scale dx.  The decoding is paid once a
// panel and row of the weight, so it pays where x has more rows than one of ggml_int8.h's tiles
// (panel_min_rows).  The result is ggml_int8.h's, up to the order of float sums.

constexpr int PANEL_LANES = 16;    // weight rows a vector (int32 lanes)
constexpr int PANEL_VECTORS = 2;   // vectors a panel
constexpr int PANEL_COLUMNS = PANEL_LANES * PANEL_VECTORS;
constexpr int PANEL_ROWS = 4;      // rows of x a tile: 4 x 2 x 3 accumulators fit 32 registers

// Rows of x from which a panel's decoding pays: up to one tile of ggml_int8.h its products are as fast.
inline int64_t panel_min_rows(int) { return INT8_ROWS + 1; }

// Byte offsets of a vector's 16 weight rows, for the gathers that decode a panel.
inline __m512i panel_row_offsets(int64_t row_bytes) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
}

// PANEL_COLUMNS weight rows of a Q4_K weight (d, dmin, 12 bytes of 6-bit scales and minimums, 128
// of qs: group 2 j the low nibbles of qs[32 j ..], 2 j + 1 the high ones), decoded:
// q [K / 4][PANEL_VECTORS][16 lanes][4 bytes] (the unsigned 4-bit values), scale and minimum
// [K / 32][PANEL_VECTORS][16] (d sc and dmin m).
struct Q4KPanel {
  std::vector<uint8_t> q;
  std::vector<float> scale, minimum;

  // Gathers one 32-bit word of each of a vector's 16 weight rows at a time (rows row_bytes apart):
  // their quads of 4-bit values, their scale words, their d and dmin.
  void decode(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t K) {
    const int64_t blocks = K / SUPER;
    q.resize(static_cast<size_t>(K * PANEL_COLUMNS));
    scale.resize(static_cast<size_t>(K / GROUP * PANEL_COLUMNS));
    minimum.resize(scale.size());
    const __m512i nibble = _mm512_set1_epi8(0x0F), six = _mm512_set1_epi32(0x3F3F3F3F);
    const __m512i low_nibbles = _mm512_set1_epi32(0x0F0F0F0F), top = _mm512_set1_epi32(0x03030303);
    const __m512i rows = panel_row_offsets(row_bytes);
    for (int v = 0; v < PANEL_VECTORS; ++v) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* b = w + (n0 + v * PANEL_LANES) * row_bytes + blk * 144;
        const __m512i halves = _mm512_i32gather_epi32(rows, b, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(halves));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(halves, 16)));
        const __m512i u0 = _mm512_i32gather_epi32(rows, b + 4, 1), u1 = _mm512_i32gather_epi32(rows, b + 8, 1);
        const __m512i u2 = _mm512_i32gather_epi32(rows, b + 12, 1);
        // k_scale_words, 16 rows at a time: the scales' and minimums' bytes 0-3 and 4-7.
        const __m512i words[2][2] = {
            {_mm512_and_si512(u0, six),
             _mm512_or_si512(_mm512_and_si512(u2, low_nibbles),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), top), 4))},
            {_mm512_and_si512(u1, six),
             _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), low_nibbles),
                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), top), 4))}};
        for (int g = 0; g < 8; ++g) {
          const int64_t at = (blk * 8 + g) * PANEL_COLUMNS + v * PANEL_LANES;
          const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(words[0][g / 4], 8 * (g % 4)), _mm512_set1_epi32(0xFF));
          const __m512i mn = _mm512_and_si512(_mm512_srli_epi32(words[1][g / 4], 8 * (g % 4)), _mm512_set1_epi32(0xFF));
          _mm512_storeu_ps(&scale[at], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
          _mm512_storeu_ps(&minimum[at], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
        }
        for (int pair = 0; pair < 4; ++pair)
          for (int j = 0; j < 8; ++j) {
            const __m512i quads = _mm512_i32gather_epi32(rows, b + 16 + 32 * pair + 4 * j, 1);
            uint8_t* out = q.data() + (((blk * 8 + 2 * pair) * 8 + j) * PANEL_COLUMNS + v * PANEL_LANES) * 4;
            _mm512_storeu_si512(out, _mm512_and_si512(quads, nibble));
            _mm512_storeu_si512(out + 8 * PANEL_COLUMNS * 4, _mm512_and_si512(_mm512_srli_epi16(quads, 4), nibble));
          }
      }
    }
  }
};

// Rows r0 .. r0 + ROWS of x against a decoded panel: y[r, n0 .. n0 + PANEL_COLUMNS) (+)=.
template <int ROWS>
inline void q4_k_panel_tile(const Q4KPanel& panel, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t N,
                            int64_t n0, bool add) {
  const int64_t blocks = K / SUPER, groups = K / GROUP;
  PanelSums<ROWS, PANEL_VECTORS> acc;
  const int8_t* xq[ROWS];
  for (int r = 0; r < ROWS; ++r) xq[r] = x.q.data() + (r0 + r) * K;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int g = 0; g < 8; ++g) {
      const int64_t group = blk * 8 + g;
      __m512i sums[ROWS][PANEL_VECTORS];
      for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_setzero_si512();
      const uint8_t* wq = panel.q.data() + group * GROUP * PANEL_COLUMNS;
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512i weights[PANEL_VECTORS];
        for (int v = 0; v < PANEL_VECTORS; ++v) weights[v] = _mm512_loadu_si512(wq + (j * PANEL_VECTORS + v) * 64);
        for (int r = 0; r < ROWS; ++r) {
          int32_t four;
          std::memcpy(&four, xq[r] + group * GROUP + 4 * j, 4);
          const __m512i xb = _mm512_set1_epi32(four);
          for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_dpbusd_epi32(sums[r][v], weights[v], xb);
        }
      }
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        const __m512 sc = _mm512_loadu_ps(&panel.scale[group * PANEL_COLUMNS + v * PANEL_LANES]);
        const __m512 mn = _mm512_loadu_ps(&panel.minimum[group * PANEL_COLUMNS + v * PANEL_LANES]);
        for (int r = 0; r < ROWS; ++r) {
          acc.partial[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][v]), sc, acc.partial[r][v]);
          acc.total[r][v] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(x.sx[(r0 + r) * groups + group]), acc.total[r][v]);
        }
      }
    }
    acc.close_block(x, r0, blk, blocks);
  }
  acc.store(y, N, r0, n0, add);
}

// Q6_K's PANEL_COLUMNS weight rows, decoded: q as Q4KPanel's (the unsigned 6-bit values), scale and
// offset [K / 16][PANEL_VECTORS][16] (d sc, and 32 d sc: w = d sc q - 32 d sc, sc per 16 weights).
struct Q6KPanel {
  static constexpr int64_t BYTES = 210;
  std::vector<uint8_t> q;
  std::vector<float> scale, offset;

  // Group g = 4 h + j's bits 0-3 from ql[64 h + 32 (j % 2) + i] (low nibble for j < 2, high for j >= 2),
  // bits 4-5 from bits 2 j, 2 j + 1 of qh[32 h + i].
  void decode(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t K) {
    const int64_t blocks = K / SUPER;
    q.resize(static_cast<size_t>(K * PANEL_COLUMNS));
    scale.resize(static_cast<size_t>(K / 16 * PANEL_COLUMNS));
    offset.resize(scale.size());
    const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
    const __m512i rows = panel_row_offsets(row_bytes);
    for (int v = 0; v < PANEL_VECTORS; ++v) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* b = w + (n0 + v * PANEL_LANES) * row_bytes + blk * BYTES;
        // d is the block's last 2 bytes: gathered with the 2 scales before it, never past the block.
        const __m512i last = _mm512_i32gather_epi32(rows, b + 206, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(last, 16)));
        __m512i words[4];
        for (int i = 0; i < 4; ++i) words[i] = _mm512_i32gather_epi32(rows, b + 192 + 4 * i, 1);
        for (int sub = 0; sub < 16; ++sub) {
          const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(words[sub / 4], 24 - 8 * (sub % 4)), 24);
          const __m512 value = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
          const int64_t at = (blk * 16 + sub) * PANEL_COLUMNS + v * PANEL_LANES;
          _mm512_storeu_ps(&scale[at], value);
          _mm512_storeu_ps(&offset[at], _mm512_mul_ps(value, _mm512_set1_ps(32.0f)));
        }
        for (int h = 0; h < 2; ++h)
          for (int t = 0; t < 8; ++t) {
            const __m512i ql0 = _mm512_i32gather_epi32(rows, b + 64 * h + 4 * t, 1);
            const __m512i ql1 = _mm512_i32gather_epi32(rows, b + 64 * h + 32 + 4 * t, 1);
            const __m512i qh = _mm512_i32gather_epi32(rows, b + 128 + 32 * h + 4 * t, 1);
            const __m512i values[4] = {
                _mm512_and_si512(ql0, nibble), _mm512_and_si512(ql1, nibble),
                _mm512_and_si512(_mm512_srli_epi16(ql0, 4), nibble), _mm512_and_si512(_mm512_srli_epi16(ql1, 4), nibble)};
            for (int j = 0; j < 4; ++j) {
              const __m512i upper = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * j), two), 4);
              uint8_t* out = q.data() + (((blk * 8 + 4 * h + j) * 8 + t) * PANEL_COLUMNS + v * PANEL_LANES) * 4;
              _mm512_storeu_si512(out, _mm512_or_si512(values[j], upper));
            }
          }
      }
    }
  }
};

// Rows r0 .. r0 + ROWS of x against a decoded Q6_K panel: y[r, n0 .. n0 + PANEL_COLUMNS) (+)=.  The
// offset meets x's rounded sums per 16 (as ggml_int8.h's), inside the super-block's sum times dx.
template <int ROWS>
inline void q6_k_panel_tile(const Q6KPanel& panel, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t N,
                            int64_t n0, bool add) {
  const int64_t blocks = K / SUPER, subs = K / 16;
  PanelSums<ROWS, PANEL_VECTORS> acc;
  const int8_t* xq[ROWS];
  for (int r = 0; r < ROWS; ++r) xq[r] = x.q.data() + (r0 + r) * K;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    #pragma GCC unroll 2
    for (int sub = 0; sub < 16; ++sub) {
      const int64_t at = blk * 16 + sub;
      __m512i sums[ROWS][PANEL_VECTORS];
      for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_setzero_si512();
      const uint8_t* wq = panel.q.data() + at * 16 * PANEL_COLUMNS;
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512i weights[PANEL_VECTORS];
        for (int v = 0; v < PANEL_VECTORS; ++v) weights[v] = _mm512_loadu_si512(wq + (j * PANEL_VECTORS + v) * 64);
        for (int r = 0; r < ROWS; ++r) {
          int32_t four;
          std::memcpy(&four, xq[r] + at * 16 + 4 * j, 4);
          const __m512i xb = _mm512_set1_epi32(four);
          for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm512_dpbusd_epi32(sums[r][v], weights[v], xb);
        }
      }
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        const __m512 sc = _mm512_loadu_ps(&panel.scale[at * PANEL_COLUMNS + v * PANEL_LANES]);
        const __m512 off = _mm512_loadu_ps(&panel.offset[at * PANEL_COLUMNS + v * PANEL_LANES]);
        for (int r = 0; r < ROWS; ++r) {
          acc.partial[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][v]), sc, acc.partial[r][v]);
          acc.partial[r][v] = _mm512_fnmadd_ps(off, _mm512_set1_ps(x.q16[(r0 + r) * subs + at]), acc.partial[r][v]);
        }
      }
    }
    acc.close_block(x, r0, blk, blocks);
  }
  acc.store(y, N, r0, n0, add);
}

