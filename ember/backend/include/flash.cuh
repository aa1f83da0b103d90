
/* ---- flash attention (backend/flash.py) ---- */
template <bool BF16> EMBER_D unsigned ember_pack2(float lo, float hi) {
  unsigned r;
  if (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
/* two neighbouring results: f32, or rounded once to the operand dtype (the backward's gradients) */
template <bool BF16> EMBER_D void ember_store2(float* p, float a, float b) { *(float2*)p = make_float2(a, b); }
template <bool BF16> EMBER_D void ember_store2(unsigned short* p, float a, float b) {
  *(unsigned*)p = ember_pack2<BF16>(a, b);
}
template <bool BF16> EMBER_D void ember_mma16816(float* c, const unsigned* a, const unsigned* b) {
  if (BF16) ember_mma_bf16(c, a, b); else ember_mma_f16(c, a, b);
}
/* The row pitch, in elements, of a shared-memory tile of rows of D values. sm_90a (HOPPER):
   panels of 64 columns, D rounded up to them (the columns past D are TMA's zeros or never
   loaded; the scores' k-steps stop at D, and the products into o, dq, dk and dv accumulate them
   in columns that are never written: wgmma's N stays a multiple of 64, the layouts of D = 64 and
   128). mma.sync: D where it is a multiple of 64 (the chunk XORed with the row), else rows of an
   odd count of 16-byte chunks (D = 32, 80, 96: 40, 88, 104), so that the eight rows an ldmatrix
   reads fall in eight bank groups with no swizzle. */
template <int D, bool HOPPER> EMBER_D constexpr int ember_pitch() {
  return HOPPER ? (D + 63) / 64 * 64 : D % 64 == 0 || (D / 8) % 2 ? D : D + 8;
}
/* the columns of a kernel's accumulators of D columns: wgmma's products are as wide as a tile's panels */
template <int D, bool HOPPER> EMBER_D constexpr int ember_cols() { return HOPPER ? ember_pitch<D, true>() : D; }
/* element offset of (row, 16-byte chunk) in a tile of rows of D values */
template <int D> EMBER_D int ember_swz(int row, int chunk) {
  if constexpr (D % 64 == 0) return (row * (D / 8) + (chunk ^ (row & 7))) * 8;
  else return row * ember_pitch<D, false>() + chunk * 8;
}
/* element offset of (row, 16-byte chunk) in a [R][D] tile stored as wgmma's descriptors read
   it (sm_90a): panels of 64 columns, each R rows of 128 bytes, the chunk XORed with the row (the
   128-byte swizzle; the tile starts on 1024 bytes) */
template <int R> EMBER_D int ember_hswz(int row, int chunk) {
  return ((chunk >> 3) * R + row) * 64 + ((chunk & 7) ^ (row & 7)) * 8;
}
/* rows [row0, row0 + ROWS) of a [nrows][D] matrix whose rows are ld apart into a tile; rows
   past nrows are zeros */
template <int D, int ROWS, bool HOPPER = false>
EMBER_D void ember_tile_load(unsigned short* s, const unsigned short* g, int row0, int nrows, int ld) {
  for (int i = threadIdx.x; i < ROWS * (D / 8); i += blockDim.x) {
    int r = i / (D / 8), c = i % (D / 8);
    bool ok = row0 + r < nrows;
    ember_cp_async16(s + (HOPPER ? ember_hswz<ROWS>(r, c) : ember_swz<D>(r, c)),
                     ok ? g + (size_t)(row0 + r) * ld + c * 8 : g, ok);
  }
}
/* the same for f32 operands (ember_flash32_*), with no swizzle: every thread of a block reads
   the same row at once */
template <int D, int ROWS, bool HOPPER = false>
EMBER_D void ember_tile_load(float* s, const float* g, int row0, int nrows, int ld) {
  for (int i = threadIdx.x; i < ROWS * (D / 4); i += blockDim.x) {
    int r = i / (D / 4), c = i % (D / 4);
    bool ok = row0 + r < nrows;
    ember_cp_async16(s + r * D + c * 4, ok ? g + (size_t)(row0 + r) * ld + c * 4 : g, ok);
  }
}
/* cp.async writes through the generic proxy; wgmma (sm_90a) reads through the async one */
template <bool HOPPER> EMBER_D void ember_proxy_fence() {
  if constexpr (HOPPER) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* tile t of two [nrows][D] matrices into slot t & 1 of their double buffers (none from tiles on) */
template <int D, int ROWS, bool HOPPER = false, typename E>
EMBER_D void ember_tiles_at(E* a, const E* ga, int lda, E* b, const E* gb, int ldb, int t, int tiles, int nrows) {
  constexpr int P = sizeof(E) == 4 ? D : ember_pitch<D, HOPPER>();   /* f32 tiles: rows of D */
  if (t < tiles) {
    ember_tile_load<D, ROWS, HOPPER>(a + (t & 1) * ROWS * P, ga, t * ROWS, nrows, lda);
    ember_tile_load<D, ROWS, HOPPER>(b + (t & 1) * ROWS * P, gb, t * ROWS, nrows, ldb);
  }
}
/* the next tile into the other slot, then wait until this tile's have arrived */
template <int D, int ROWS, bool HOPPER = false, typename E>
EMBER_D void ember_next_tiles(E* a, const E* ga, int lda, E* b, const E* gb, int ldb, int t, int tiles, int nrows) {
  ember_tiles_at<D, ROWS, HOPPER>(a, ga, lda, b, gb, ldb, t + 1, tiles, nrows);
  ember_cp_async_commit();
  ember_cp_async_wait<1>();
  ember_proxy_fence<HOPPER>();
  __syncthreads();
}
/* A fragment: rows row0..row0+15, columns 16 kk..16 kk+15 */
template <int D> EMBER_D void ember_frag_a(unsigned* a, const unsigned short* s, int row0, int kk) {
  int lane = threadIdx.x & 31;
  ember_ldmatrix4(a, s + ember_swz<D>(row0 + (lane & 15), 2 * kk + (lane >> 4)));
}
/* B fragments of two n-tiles (b[0..1]: n0..n0+7, b[2..3]: n0+8..15) from a tile whose rows are n
   and columns k (columns 16 kk..16 kk+15) */
template <int D> EMBER_D void ember_frag_b(unsigned* b, const unsigned short* s, int n0, int kk) {
  int lane = threadIdx.x & 31;
  ember_ldmatrix4(b, s + ember_swz<D>(n0 + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
}
/* the same from a tile whose rows are k (rows k0..k0+15) and columns n (n0 a multiple of 16) */
template <int D> EMBER_D void ember_frag_bt(unsigned* b, const unsigned short* s, int k0, int n0) {
  int lane = threadIdx.x & 31;
  ember_ldmatrix4_trans(b, s + ember_swz<D>(k0 + ((lane >> 3) & 1) * 8 + (lane & 7), n0 / 8 + (lane >> 4)));
}
/* acc[m][NT][4] += A (16 x 16 BK, in registers as accumulators of 16 x 8 tiles) * B (BK x 8 NT, from
   column c0) from a tile whose rows are k, for WM row tiles m: each B fragment loaded serves them all */
template <int D, int BK, int NT, bool BF16, int WM = 1>
EMBER_D void ember_acc_pt(float (*acc)[NT][4], float (*p)[BK / 8][4], const unsigned short* s, int c0) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++) {
    unsigned a[WM][4];
#pragma unroll
    for (int m = 0; m < WM; m++) {
      a[m][0] = ember_pack2<BF16>(p[m][2 * kk][0], p[m][2 * kk][1]);
      a[m][1] = ember_pack2<BF16>(p[m][2 * kk][2], p[m][2 * kk][3]);
      a[m][2] = ember_pack2<BF16>(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
      a[m][3] = ember_pack2<BF16>(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dd = 0; dd < NT / 2; dd++) {
      unsigned b[4];
      ember_frag_bt<D>(b, s, kk * 16, c0 + dd * 16);
#pragma unroll
      for (int m = 0; m < WM; m++) {
        ember_mma16816<BF16>(acc[m][2 * dd], a[m], b);
        ember_mma16816<BF16>(acc[m][2 * dd + 1], a[m], b + 2);
      }
    }
  }
}
/* s[m][BN/8][4] = A (WM tiles of 16 rows, all D columns) * B^T (BN rows of tile sb): each B fragment
   loaded once serves the WM row tiles. frag_a(a, m, kk) gives row tile m's A fragment of columns
   16 kk..: from shared memory (EmberSmemFrags) or from registers (EmberRegFrags) */
template <int D, int BN, int WM, bool BF16, typename FA>
EMBER_D void ember_scores(float (*s)[BN / 8][4], const FA& frag_a, const unsigned short* sb) {
#pragma unroll
  for (int m = 0; m < WM; m++)
#pragma unroll
    for (int n = 0; n < BN / 8; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    unsigned a[WM][4];
#pragma unroll
    for (int m = 0; m < WM; m++) frag_a(a[m], m, kk);
#pragma unroll
    for (int nn = 0; nn < BN / 16; nn++) {
      unsigned b[4];
      ember_frag_b<D>(b, sb, nn * 16, kk);
#pragma unroll
      for (int m = 0; m < WM; m++) {
        ember_mma16816<BF16>(s[m][2 * nn], a[m], b);
        ember_mma16816<BF16>(s[m][2 * nn + 1], a[m], b + 2);
      }
    }
  }
}
/* A fragments read from a tile in shared memory, rows row0.. of it, as ember_scores takes them */
template <int D> struct EmberSmemFrags {
  const unsigned short* s;
  int row0;
  __device__ void operator()(unsigned* a, int m, int kk) const { ember_frag_a<D>(a, s, row0 + 16 * m, kk); }
};
/* the same fragments held in registers, loaded once (a block's own rows, read by every tile: each
   of the tile loop's ldmatrix reads shared memory, the mma.sync kernels' bound). Where they fit:
   mma.sync, D <= 64 (not beside D = 128's accumulators), and no score graph that reads sources
   (ALiBi's forward spilled 72 bytes) */
template <bool HOPPER, int D, typename SM> EMBER_D constexpr bool ember_frags_in_registers() {
  return !HOPPER && D <= 64 && !SM::loads;
}
template <int D, int WM> struct EmberRegFrags {
  unsigned f[WM][D / 16][4];
  __device__ void load(const unsigned short* s, int row0) {
    const EmberSmemFrags<D> from{s, row0};
#pragma unroll
    for (int m = 0; m < WM; m++)
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) from(f[m][kk], m, kk);
  }
  __device__ void operator()(unsigned* a, int m, int kk) const {
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = f[m][kk][i];
  }
};

/* The same two products for one warpgroup on sm_90a (HOPPER): EmberWg<true> (flash.py's sm_90a
   helpers, only in a source that has such kernels) does them with wgmma from tiles in
   ember_hswz's layout. Their fragments are laid out as the mma.sync ones, so the kernels'
   element code is shared. */
template <bool HOPPER> struct EmberWg;
template <int D, int BN, int WM, bool BF16, bool HOPPER>
EMBER_D void ember_scores_any(float (*s)[BN / 8][4], const unsigned short* sa, int rows_a, const unsigned short* sb) {
  if constexpr (HOPPER) EmberWg<HOPPER>::template scores<D, BN, BF16>(&s[0][0][0], sa, rows_a, sb);
  else ember_scores<D, BN, WM, BF16>(s, EmberSmemFrags<D>{sa, (int)(threadIdx.x >> 5) * 16 * WM}, sb);
}
/* acc (NT groups of 8 columns from column c0, a multiple of 64 on sm_90a) += p times a tile of D
   columns, for WM row tiles (sm_90a: one) */
template <int D, int BK, int NT, bool BF16, bool HOPPER, int WM = 1>
EMBER_D void ember_acc_any(float (*acc)[NT][4], float (*p)[BK / 8][4], const unsigned short* sb, int c0 = 0) {
  if constexpr (HOPPER) EmberWg<HOPPER>::template acc<8 * NT, BK, BF16>(&acc[0][0][0], p[0], sb + c0 / 64 * BK * 64);
  else ember_acc_pt<D, BK, NT, BF16, WM>(acc, p, sb, c0);
}
/* the dynamic shared memory, from 1024 bytes on for sm_90a's swizzled tiles */
template <bool HOPPER> EMBER_D unsigned short* ember_flash_tiles() {
  extern __shared__ __align__(128) unsigned char ember_flash_bytes[];
  if constexpr (HOPPER)
    return (unsigned short*)(ember_flash_bytes +
                             ((1024 - ((unsigned)__cvta_generic_to_shared(ember_flash_bytes) & 1023)) & 1023));
  else
    return (unsigned short*)ember_flash_bytes;
}

/* The tiles [x, y) of the streamed side (count rows, TILE a tile) that the score graph's iota
   masks keep a score of for the block's rows r0..r1 (KEYS: the block's rows are keys, the tiles
   queries): the first and last live tile and all between them. */
template <int TILE, bool KEYS, typename SM>
EMBER_D int2 ember_flash_span(const SM& sm, int nb, int r0, int r1, int count) {
  const int tiles = (count + TILE - 1) / TILE;
  int first = tiles, last = 0;
#pragma unroll 1
  for (int t = 0; t < tiles; t++) {
    const int a = t * TILE, b = min(a + TILE, count) - 1;
    if (KEYS ? sm.live(nb, a, b, r0, r1) : sm.live(nb, r0, r1, a, b)) {
      first = min(first, t);
      last = t + 1;
    }
  }
  return make_int2(first, max(first, last));
}
/* Whether rows r0.. of a block or tile of N rows (r0 a multiple of N) may pass count: never where
   N divides count, which a constant count makes known at compile time (no test is left) */
template <int N> EMBER_D bool ember_flash_past(int r, int count) { return count % N != 0 && r >= count; }
/* Whether the tile c0..c0+N-1 of the streamed side (count rows, c0 a multiple of N) needs the
   score graph's iota masks or the bound count, against the block's rows r0..r1 */
template <int N, bool KEYS, typename SM>
EMBER_D bool ember_flash_edge(const SM& sm, int nb, int r0, int r1, int c0, int count) {
  if (ember_flash_past<N>(c0 + N - 1, count)) return true;
  return KEYS ? !sm.full(nb, c0, c0 + N - 1, r0, r1) : !sm.full(nb, r0, r1, c0, c0 + N - 1);
}

/* One 16-row tile's step of the online softmax over BN keys from col0: the raw scores s (this
   thread's 2 rows r_lo and r_lo + 8, in the accumulator layout) made the score graph's base-2
   scores over SM::scale (edge tiles: the iota masks and the bound S in), the running max m and
   sum l updated (the 4 threads of a row combine with shuffles), o rescaled, and s replaced by
   the weights exp2(part scale - m), one fma and an exponential an element. Rows past T are
   computed, never written; where the score graph reads sources (SM::loads) they read row T - 1's. */
/* the row of element e of a thread's accumulator fragment, where the score graph reads its sources
   no further than row T - 1; as r_lo + 8 h, not from an array of two, ptxas compares an iota
   mask's col - row once for the elements that share it */
template <typename SM> EMBER_D int ember_flash_row(int r_lo, int e, int T) {
  return SM::loads ? min(r_lo + (e >> 1) * 8, T - 1) : r_lo + (e >> 1) * 8;
}
/* DEFER: o is not rescaled but each row's factor left in rs (a product into o is still running:
   ember_flash_fwd_ws rescales after waiting for it) */
template <int BN, int NT, typename SM, bool DEFER = false>
EMBER_D void ember_flash_online(float (*s)[4], float* m, float* l, float (*o)[4], const SM& sm, int nb, int col0,
                                int r_lo, int T, int S, bool edge, float* rs = nullptr) {
  const int lane = threadIdx.x & 31;
  if (edge) {
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = col0 + n * 8 + (lane & 3) * 2 + (e & 1);
        s[n][e] = ember_flash_past<BN>(col, S) ? -INFINITY : sm.template part<true>(s[n][e], nb, ember_flash_row<SM>(r_lo, e, T), col);
      }
  } else {
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        s[n][e] = sm.template part<false>(s[n][e], nb, ember_flash_row<SM>(r_lo, e, T), col0 + n * 8 + (lane & 3) * 2 + (e & 1));
  }

#pragma unroll
  for (int h = 0; h < 2; h++) {
    float mx = m[h];
#pragma unroll
    for (int n = 0; n < BN / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]) * SM::scale);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.f : mx;   /* no key seen yet: every weight is 0 */
    const float r = ember_ex2(m[h] - base);
    m[h] = mx;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; e++) {
        s[n][e] = ember_ex2(fmaf(s[n][e], SM::scale, -base));
        sum += s[n][e];
      }
    l[h] = l[h] * r + sum;
    if (DEFER) {
      rs[h] = r;
    } else {
#pragma unroll
      for (int x = 0; x < NT; x++) { o[x][2 * h] *= r; o[x][2 * h + 1] *= r; }
    }
  }
}
/* rows r_lo and r_lo + 8 of the forward's output, o / l rounded once to the operand dtype: rows
   of D, or (LSE: a gradient is taken) rows of D + 2 whose last two hold the base-2 logsumexp
   m + log2(l) as an f32 (4-byte aligned: D is even), which the backward kernels read (ember_lse) */
template <int D, bool LSE> EMBER_D constexpr int ember_flash_width() { return LSE ? D + 2 : D; }
template <int D> EMBER_D const float* ember_lse(const unsigned short* packed) {
  return reinterpret_cast<const float*>(packed + D);
}
template <int D> EMBER_D constexpr int ember_lse_ld() { return ember_flash_width<D, true>() / 2; }   /* in floats */
template <int D, bool BF16, bool LSE>
EMBER_D void ember_flash_out(unsigned short* out, float (*o)[4], float* m, float* l, int r_lo, int T) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = r_lo + h * 8;
    if (row >= T) continue;
    const float inv = 1.f / l[h];
    unsigned short* dst = out + (size_t)row * ember_flash_width<D, LSE>();
#pragma unroll
    for (int x = 0; x < D / 8; x++)
      ember_store2<BF16>(dst + x * 8 + (lane & 3) * 2, o[x][2 * h] * inv, o[x][2 * h + 1] * inv);
    if (LSE && (lane & 3) == 0) *reinterpret_cast<float*>(dst + D) = m[h] + log2f(l[h]);
  }
}

/* ROWS query rows per block, TILE keys per tile. mma.sync: 4 warps, ROWS / 64 tiles of 16 rows
   per warp (each K fragment loaded from shared memory serves them all). HOPPER (sm_90a): two
   warpgroups of 64 rows (warp w: rows 16 w.. of the block, in the fragment layout of mma.sync's
   accumulators); s = q k^T is wgmma from shared memory, and p stays in registers as the A
   operand of o += p v, whose B (v, contiguous along D) is read transposed. */
template <int D, int ROWS, int TILE, bool BF16, bool HOPPER, bool LSE, typename SM>
EMBER_D void ember_flash_fwd(unsigned short* out, const unsigned short* q, const unsigned short* k,
                             const unsigned short* v, int ldq, int ldk, int ldv, int T, int S, const SM& sm) {
  constexpr int BM = ROWS, BN = TILE, WM = HOPPER ? 1 : ROWS / 64, NT = ember_cols<D, HOPPER>() / 8;
  constexpr int P = ember_pitch<D, HOPPER>();
  unsigned short *sq = ember_flash_tiles<HOPPER>(), *sk = sq + BM * P, *sv = sk + 2 * BN * P;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * BM;  /* longest rows first (causal) */
  const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);
  const int first = span.x, tiles = span.y;
  ember_tile_load<D, BM, HOPPER>(sq, q, row0, T, ldq);
  ember_tiles_at<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, first, tiles, S);
  ember_cp_async_commit();
  float o[WM][NT][4], m[WM][2], l[WM][2];
#pragma unroll
  for (int w = 0; w < WM; w++) {
    m[w][0] = m[w][1] = -INFINITY;
    l[w][0] = l[w][1] = 0.f;
#pragma unroll
    for (int x = 0; x < NT; x++) o[w][x][0] = o[w][x][1] = o[w][x][2] = o[w][x][3] = 0.f;
  }
  const int r_lo = row0 + warp * 16 * WM + (lane >> 2);   /* rows r_lo + 16 w and r_lo + 16 w + 8 */
  /* the warp's q fragments in registers (32 of them at D = 64), loaded at the first tile */
  constexpr bool QREG = ember_frags_in_registers<HOPPER, D, SM>();
  EmberRegFrags<QREG ? D : 16, QREG ? WM : 1> qf;
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const unsigned short *ck = sk + (t & 1) * BN * P, *cv = sv + (t & 1) * BN * P;
    float s[WM][BN / 8][4];
    if constexpr (QREG) {
      if (t == first) qf.load(sq, warp * 16 * WM);   /* q has arrived with the first tiles */
      ember_scores<D, BN, WM, BF16>(s, qf, ck);
    } else {
      ember_scores_any<D, BN, WM, BF16, HOPPER>(s, HOPPER ? sq + (warp >> 2) * 64 * 64 : sq, BM, ck);
    }
    const bool edge = ember_flash_edge<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, t * BN, S);
#pragma unroll
    for (int w = 0; w < WM; w++)
      ember_flash_online<BN, NT>(s[w], m[w], l[w], o[w], sm, nb, t * BN, r_lo + 16 * w, T, S, edge);
    ember_acc_any<D, BN, NT, BF16, HOPPER, WM>(o, s, cv);
    __syncthreads();   /* this slot is filled again two tiles on */
  }
#pragma unroll
  for (int w = 0; w < WM; w++)
    ember_flash_out<D, BF16, LSE>(out + (size_t)nb * T * ember_flash_width<D, LSE>(), o[w], m[w], l[w], r_lo + 16 * w, T);
}

/* rows r_lo and r_lo + 8 (those below nrows) of a gradient whose rows are ld apart, times
   scale, rounded once to OUT (f32, or the operands' 16-bit dtype) */
template <int D, bool BF16, typename OUT>
EMBER_D void ember_flash_rows_out(OUT* out, float (*acc)[4], int r_lo, int nrows, int ld, float scale) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = r_lo + h * 8;
    if (row >= nrows) continue;
#pragma unroll
    for (int x = 0; x < D / 8; x++)
      ember_store2<BF16>(out + (size_t)row * ld + x * 8 + (lane & 3) * 2, acc[x][2 * h] * scale,
                         acc[x][2 * h + 1] * scale);
  }
}

/* p = exp2(part scale - lse) and ds = p (dp - di) [times the score's derivative: DGRAD] for the 2
   rows (ROWS_ARE_KEYS: 2 key rows, so the columns are queries) of a block of RB and BN columns
   of this thread; entries past T or S (EDGE tiles only) are 0, and only edge tiles pay for the
   iota masks and for clamping the rows of lse and di they read: the others' loads are at fixed
   offsets. */
template <int BN, int RB, bool ROWS_ARE_KEYS, bool EDGE, bool DGRAD, typename SM>
EMBER_D void ember_flash_ds_tile(float (*s)[4], float (*dp)[4], const SM& sm, int nb, int r_lo, int col0, int T,
                                 int S, const float* lse, int lse_stride, const float* di) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < BN / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int row = r_lo + (e >> 1) * 8, col = col0 + n * 8 + (lane & 3) * 2 + (e & 1);
      int i = ROWS_ARE_KEYS ? col : row, j = ROWS_ARE_KEYS ? row : col;
      const bool past_i = ROWS_ARE_KEYS ? ember_flash_past<BN>(col, T) : ember_flash_past<RB>(row, T);
      const bool past_j = ROWS_ARE_KEYS ? ember_flash_past<RB>(row, S) : ember_flash_past<BN>(col, S);
      const bool out = EDGE && (past_i || past_j);
      if (EDGE && past_i) i = T - 1;
      if (EDGE && SM::loads && past_j) j = S - 1;   /* the score graph reads its sources at j */
      const float x = s[n][e], base = lse[(size_t)i * lse_stride];   /* loaded on every path: one load a row */
      const float p = ember_ex2(fmaf(sm.template part<EDGE>(x, nb, i, j), SM::scale, -base));
      s[n][e] = out ? 0.f : p;
      dp[n][e] = s[n][e] * (dp[n][e] - di[i]);
      if (DGRAD) dp[n][e] *= sm.template grad<EDGE>(x, nb, i, j);
    }
}
/* a branch, not a select per element: ptxas keeps both versions of the tile */
template <int BN, int RB, bool ROWS_ARE_KEYS, bool DGRAD, typename SM>
EMBER_D void ember_flash_ds(float (*s)[4], float (*dp)[4], const SM& sm, int nb, int r_lo, int col0, int T, int S,
                            const float* lse, int lse_stride, const float* di, bool edge) {
  if (edge)
    ember_flash_ds_tile<BN, RB, ROWS_ARE_KEYS, true, DGRAD>(s, dp, sm, nb, r_lo, col0, T, S, lse, lse_stride, di);
  else
    ember_flash_ds_tile<BN, RB, ROWS_ARE_KEYS, false, DGRAD>(s, dp, sm, nb, r_lo, col0, T, S, lse, lse_stride, di);
}

template <int D, int ROWS, int TILE, bool BF16, bool HOPPER, bool DGRAD, typename OUT, typename SM>
EMBER_D void ember_flash_dq(OUT* out, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                            const unsigned short* packed, const unsigned short* dout, const float* di, int ldq, int ldk,
                            int ldv, int T, int S, float cs, const SM& sm) {
  constexpr int BM = ROWS, BN = TILE, NT = ember_cols<D, HOPPER>() / 8, P = ember_pitch<D, HOPPER>();
  unsigned short *sq = ember_flash_tiles<HOPPER>(), *sdo = sq + BM * P, *sk = sdo + BM * P, *sv = sk + 2 * BN * P;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * BM;
  const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);
  const int first = span.x, tiles = span.y;
  ember_tile_load<D, BM, HOPPER>(sq, q, row0, T, ldq);
  ember_tile_load<D, BM, HOPPER>(sdo, dout, row0, T, D);
  ember_tiles_at<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, first, tiles, S);
  ember_cp_async_commit();
  float acc[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.f;
  const int r_lo = row0 + warp * 16 + (lane >> 2);
  constexpr bool QREG = ember_frags_in_registers<HOPPER, D, SM>();   /* q's and do's fragments in registers */
  EmberRegFrags<QREG ? D : 16, 1> qf, dof;
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const unsigned short *ck = sk + (t & 1) * BN * P, *cv = sv + (t & 1) * BN * P;
    float s[1][BN / 8][4], dp[1][BN / 8][4];
    if constexpr (QREG) {
      if (t == first) { qf.load(sq, warp * 16); dof.load(sdo, warp * 16); }
      ember_scores<D, BN, 1, BF16>(s, qf, ck);
      ember_scores<D, BN, 1, BF16>(dp, dof, cv);
    } else {
      ember_scores_any<D, BN, 1, BF16, HOPPER>(s, sq, BM, ck);
      ember_scores_any<D, BN, 1, BF16, HOPPER>(dp, sdo, BM, cv);
    }
    const bool edge = ember_flash_past<BM>(row0 + BM - 1, T) ||
                      ember_flash_edge<BN, false>(sm, nb, row0, row0 + BM - 1, t * BN, S);
    ember_flash_ds<BN, BM, false, DGRAD>(s[0], dp[0], sm, nb, r_lo, t * BN, T, S, ember_lse<D>(packed), ember_lse_ld<D>(), di, edge);
    ember_acc_any<D, BN, NT, BF16, HOPPER>(&acc, dp, ck);
    __syncthreads();
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * T * D, acc, r_lo, T, D, cs);
}

/* DC: the columns of dk and dv a block adds up, from DC blockIdx.z on (D = 256: two blocks a key
   block, each computing the scores again, or 256 accumulators a thread would not fit) */
template <int D, int ROWS, int TILE, bool BF16, bool HOPPER, bool DGRAD, int DC = D, typename OUT, typename SM>
EMBER_D void ember_flash_dkdv(OUT* out, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                              const unsigned short* packed, const unsigned short* dout, const float* di, int ldq, int ldk,
                              int ldv, int T, int S, float cs, const SM& sm) {
  constexpr int BN = ROWS, BM = TILE, NT = ember_cols<DC, HOPPER>() / 8, P = ember_pitch<D, HOPPER>();
  unsigned short *sk = ember_flash_tiles<HOPPER>(), *sv = sk + BN * P, *sq = sv + BN * P, *sdo = sq + 2 * BM * P;
  const int c0 = DC == D ? 0 : blockIdx.z * DC;   /* BN keys per block, BM queries per tile, columns c0.. of dk and dv */
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key0 = blockIdx.x * BN;
  const int2 span = ember_flash_span<BM, true>(sm, nb, key0, min(key0 + BN, S) - 1, T);
  const int first = span.x, tiles = span.y;
  ember_tile_load<D, BN, HOPPER>(sk, k, key0, S, ldk);
  ember_tile_load<D, BN, HOPPER>(sv, v, key0, S, ldv);
  ember_tiles_at<D, BM, HOPPER>(sq, q, ldq, sdo, dout, D, first, tiles, T);
  ember_cp_async_commit();
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.f;
  const int r_lo = key0 + warp * 16 + (lane >> 2);   /* this thread's key rows */
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, BM, HOPPER>(sq, q, ldq, sdo, dout, D, t, tiles, T);
    const unsigned short *cq = sq + (t & 1) * BM * P, *cdo = sdo + (t & 1) * BM * P;
    float s[1][BM / 8][4], dp[1][BM / 8][4];
    ember_scores_any<D, BM, 1, BF16, HOPPER>(s, sk, BN, cq);     /* s^T: keys x queries */
    ember_scores_any<D, BM, 1, BF16, HOPPER>(dp, sv, BN, cdo);   /* dp^T = v do^T */
    const bool edge = ember_flash_past<BN>(key0 + BN - 1, S) ||
                      ember_flash_edge<BM, true>(sm, nb, key0, key0 + BN - 1, t * BM, T);
    ember_flash_ds<BM, BN, true, DGRAD>(s[0], dp[0], sm, nb, r_lo, t * BM, T, S, ember_lse<D>(packed), ember_lse_ld<D>(), di, edge);
    ember_acc_any<D, BM, NT, BF16, HOPPER>(&dv, s, cdo, c0);
    ember_acc_any<D, BM, NT, BF16, HOPPER>(&dk, dp, cq, c0);
    __syncthreads();
  }
  ember_flash_rows_out<DC, BF16>(out + (size_t)nb * S * 2 * D + c0, dk, r_lo, S, 2 * D, cs);
  ember_flash_rows_out<DC, BF16>(out + (size_t)nb * S * 2 * D + D + c0, dv, r_lo, S, 2 * D, 1.f);
}
