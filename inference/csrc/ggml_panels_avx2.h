// Products of many rows of x rounded to 8 bits (RoundedX8) with Q4_K and Q6_K weights on AVX2, for
// prefill chunks and wide decode batches: ggml_panels.h's panels, with maddubs where AVX-512 VNNI has
// dpbusd.  Included by ggml_blocks.cpp after ggml_int8.h inside its AVX2 namespace; no include guard,
// on purpose.
//
// ggml_int8.h's tiles take two integer multiplies per 32 weights and row of x: maddubs, then madd by
// the sub-block's scale.  Here a panel of PANEL_COLUMNS weight rows is first decoded into 4
// consecutive weights of 8 weight rows a 256-bit vector (a 32-bit word of each row, transposed 8 rows
// at a time), so that one maddubs multiplies them by 4 bytes of x broadcast: 16 lanes, two a weight
// row.  Those 16-bit sums add up without a multiply (Q4_K: a sub-block's 8 steps of at most
// 2 * 15 * 127; Q6_K: 2 steps of at most 2 * 63 * 127, under 2^15), then one madd by ones widens them
// to a weight row's 32-bit sum: 9 multiplies per 32 weights of 8 weight rows and a row of x (Q6_K:
// 12) where the tiles take 16.  The sub-block's sum then leaves the integers as in ggml_panels.h (times d sc
// in float, the minimums or the offset, the super-block's sum times dx), so the result is ggml_int8.h's
// up to the order of float sums, and ggml_panels.h's exactly.

constexpr int PANEL_LANES = 8;     // weight rows a vector (the 32-bit words of one maddubs)
constexpr int PANEL_VECTORS = 2;   // vectors a panel
constexpr int PANEL_COLUMNS = PANEL_LANES * PANEL_VECTORS;
constexpr int PANEL_ROWS = 4;      // rows of x a tile: 4 x 2 16-bit sums, the weights and x in 16 registers

// Rows of x from which a panel's decoding pays (measured: below, ggml_int8.h's tiles, which decode
// nothing, are as fast; Q6_K's panel decodes 6 bits from three places and 16 scales a block).
inline int64_t panel_min_rows(int type) { return type == TYPE_Q4_K ? 10 : 32; }

// out[t] lane i: the 32-bit word at p + i * stride + 4 t, for t, i < 8 (8 rows' 32 bytes, transposed).
inline void transposed_words(const uint8_t* p, int64_t stride, __m256i (&out)[8]) {
  __m256i r[8], pairs[8], quads[8];
  for (int i = 0; i < 8; ++i) r[i] = load32(p + i * stride);
  for (int i = 0; i < 8; i += 2) {
    pairs[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);      // words 0, 1 | 4, 5 of rows i, i + 1
    pairs[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // words 2, 3 | 6, 7
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      quads[i + 2 * h] = _mm256_unpacklo_epi64(pairs[i + h], pairs[i + 2 + h]);      // word 2 h | 2 h + 4 of 4 rows
      quads[i + 2 * h + 1] = _mm256_unpackhi_epi64(pairs[i + h], pairs[i + 2 + h]);  // word 2 h + 1 | 2 h + 5
    }
  for (int t = 0; t < 4; ++t) {
    out[t] = _mm256_permute2x128_si256(quads[t], quads[4 + t], 0x20);
    out[t + 4] = _mm256_permute2x128_si256(quads[t], quads[4 + t], 0x31);
  }
}

// x's 4 rounded values at p in every 32-bit lane.
inline __m256i broadcast4(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  return _mm256_set1_epi32(four);
}

// PANEL_COLUMNS weight rows of a Q4_K weight, decoded: q [K / 4][PANEL_VECTORS][8 lanes][4 bytes]
// (the unsigned 4-bit values), scale and minimum [K / 32][PANEL_COLUMNS] (d sc and dmin m).
struct Q4KPanel {
  std::vector<uint8_t> q;
  std::vector<float> scale, minimum;

  void decode(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t K) {
    const int64_t blocks = K / SUPER;
    q.resize(static_cast<size_t>(K * PANEL_COLUMNS));
    scale.resize(static_cast<size_t>(K / GROUP * PANEL_COLUMNS));
    minimum.resize(scale.size());
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int v = 0; v < PANEL_VECTORS; ++v) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* b = w + (n0 + v * PANEL_LANES) * row_bytes + blk * 144;
        for (int i = 0; i < PANEL_LANES; ++i) {
          const uint8_t* row = b + i * row_bytes;
          uint64_t scales, minimums;
          k_scale_words(row, scales, minimums);
          const float d = half_to_float(row), dmin = half_to_float(row + 2);
          for (int g = 0; g < 8; ++g) {
            const int64_t at = (blk * 8 + g) * PANEL_COLUMNS + v * PANEL_LANES + i;
            scale[at] = d * static_cast<float>((scales >> (8 * g)) & 0xFF);
            minimum[at] = dmin * static_cast<float>((minimums >> (8 * g)) & 0xFF);
          }
        }
        for (int pair = 0; pair < 4; ++pair) {
          __m256i words[8];
          transposed_words(b + 16 + 32 * pair, row_bytes, words);
          for (int t = 0; t < 8; ++t) {
            uint8_t* out = q.data() + (((blk * 8 + 2 * pair) * 8 + t) * PANEL_COLUMNS + v * PANEL_LANES) * 4;
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(words[t], nibble));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * PANEL_COLUMNS * 4),
                                _mm256_and_si256(_mm256_srli_epi16(words[t], 4), nibble));
          }
        }
      }
    }
  }
};

// Rows r0 .. r0 + ROWS of x against a decoded Q4_K panel: y[r, n0 .. n0 + PANEL_COLUMNS) (+)=.
template <int ROWS>
inline void q4_k_panel_tile(const Q4KPanel& panel, const RoundedX8& x, int64_t r0, int64_t K, float* y, int64_t N,
                            int64_t n0, bool add) {
  const int64_t blocks = K / SUPER, groups = K / GROUP;
  const __m256i ones = _mm256_set1_epi16(1);
  PanelSums<ROWS, PANEL_VECTORS> acc;
  const int8_t* xq[ROWS];
  for (int r = 0; r < ROWS; ++r) xq[r] = x.q.data() + (r0 + r) * K;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int g = 0; g < 8; ++g) {
      const int64_t group = blk * 8 + g;
      __m256i sums[ROWS][PANEL_VECTORS];
      for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm256_setzero_si256();
      const uint8_t* wq = panel.q.data() + group * GROUP * PANEL_COLUMNS;
      // Not unrolled: GCC would make a tree of the 16-bit sums, every product spilled first.
      #pragma GCC unroll 1
      for (int j = 0; j < 8; ++j) {
        __m256i weights[PANEL_VECTORS];
        for (int v = 0; v < PANEL_VECTORS; ++v) weights[v] = load32(wq + (j * PANEL_VECTORS + v) * 32);
        for (int r = 0; r < ROWS; ++r) {
          const __m256i xb = broadcast4(xq[r] + group * GROUP + 4 * j);
          for (int v = 0; v < PANEL_VECTORS; ++v)
            sums[r][v] = _mm256_add_epi16(sums[r][v], _mm256_maddubs_epi16(weights[v], xb));
        }
      }
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        const __m256 sc = _mm256_loadu_ps(&panel.scale[group * PANEL_COLUMNS + v * PANEL_LANES]);
        const __m256 mn = _mm256_loadu_ps(&panel.minimum[group * PANEL_COLUMNS + v * PANEL_LANES]);
        for (int r = 0; r < ROWS; ++r) {
          const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[r][v], ones));
          acc.partial[r][v] = _mm256_fmadd_ps(sum, sc, acc.partial[r][v]);
          acc.total[r][v] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(x.sx[(r0 + r) * groups + group]), acc.total[r][v]);
        }
      }
    }
    acc.close_block(x, r0, blk, blocks);
  }
  acc.store(y, N, r0, n0, add);
}

// Q6_K's PANEL_COLUMNS weight rows, decoded: q as Q4KPanel's (the unsigned 6-bit values), scale and
// offset [K / 16][PANEL_COLUMNS] (d sc, and 32 d sc: w = d sc q - 32 d sc, sc per 16 weights).
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
    const __m256i nibble = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    for (int v = 0; v < PANEL_VECTORS; ++v) {
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint8_t* b = w + (n0 + v * PANEL_LANES) * row_bytes + blk * BYTES;
        for (int i = 0; i < PANEL_LANES; ++i) {
          const uint8_t* row = b + i * row_bytes;
          const float d = half_to_float(row + 208);
          for (int sub = 0; sub < 16; ++sub) {
            const float value = d * static_cast<float>(static_cast<int8_t>(row[192 + sub]));
            const int64_t at = (blk * 16 + sub) * PANEL_COLUMNS + v * PANEL_LANES + i;
            scale[at] = value;
            offset[at] = value * 32.0f;
          }
        }
        for (int h = 0; h < 2; ++h) {
          __m256i ql0[8], ql1[8], qh[8];
          transposed_words(b + 64 * h, row_bytes, ql0);
          transposed_words(b + 64 * h + 32, row_bytes, ql1);
          transposed_words(b + 128 + 32 * h, row_bytes, qh);
          for (int t = 0; t < 8; ++t) {
            const __m256i values[4] = {
                _mm256_and_si256(ql0[t], nibble), _mm256_and_si256(ql1[t], nibble),
                _mm256_and_si256(_mm256_srli_epi16(ql0[t], 4), nibble), _mm256_and_si256(_mm256_srli_epi16(ql1[t], 4), nibble)};
            for (int j = 0; j < 4; ++j) {
              const __m256i upper = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[t], 2 * j), two), 4);
              uint8_t* out = q.data() + (((blk * 8 + 4 * h + j) * 8 + t) * PANEL_COLUMNS + v * PANEL_LANES) * 4;
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(values[j], upper));
            }
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
  const __m256i ones = _mm256_set1_epi16(1);
  PanelSums<ROWS, PANEL_VECTORS> acc;
  const int8_t* xq[ROWS];
  for (int r = 0; r < ROWS; ++r) xq[r] = x.q.data() + (r0 + r) * K;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    #pragma GCC unroll 1  // as q4_k_panel_tile's steps
    for (int sub = 0; sub < 16; ++sub) {
      const int64_t at = blk * 16 + sub;
      __m256i sums[ROWS][PANEL_VECTORS];
      for (int r = 0; r < ROWS; ++r)
        for (int v = 0; v < PANEL_VECTORS; ++v) sums[r][v] = _mm256_setzero_si256();
      const uint8_t* wq = panel.q.data() + at * 16 * PANEL_COLUMNS;
      for (int half = 0; half < 2; ++half) {  // 2 steps in 16 bits, then widened
        __m256i weights[2][PANEL_VECTORS];
        for (int j = 0; j < 2; ++j)
          for (int v = 0; v < PANEL_VECTORS; ++v) weights[j][v] = load32(wq + ((2 * half + j) * PANEL_VECTORS + v) * 32);
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* xs = xq[r] + at * 16 + 8 * half;
          const __m256i x0 = broadcast4(xs), x1 = broadcast4(xs + 4);
          for (int v = 0; v < PANEL_VECTORS; ++v) {
            const __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(weights[0][v], x0), _mm256_maddubs_epi16(weights[1][v], x1));
            sums[r][v] = _mm256_add_epi32(sums[r][v], _mm256_madd_epi16(pair, ones));
          }
        }
      }
      for (int v = 0; v < PANEL_VECTORS; ++v) {
        const __m256 sc = _mm256_loadu_ps(&panel.scale[at * PANEL_COLUMNS + v * PANEL_LANES]);
        const __m256 off = _mm256_loadu_ps(&panel.offset[at * PANEL_COLUMNS + v * PANEL_LANES]);
        for (int r = 0; r < ROWS; ++r) {
          acc.partial[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][v]), sc, acc.partial[r][v]);
          acc.partial[r][v] = _mm256_fnmadd_ps(off, _mm256_set1_ps(x.q16[(r0 + r) * subs + at]), acc.partial[r][v]);
        }
      }
    }
    acc.close_block(x, r0, blk, blocks);
  }
  acc.store(y, N, r0, n0, add);
}
