"""CUDA rendering of the flash-attention kernels that compiler/attention.py puts in the graph.

Three kernels on `mma.sync.m16n8k16` (sm_80 and later; f16 or bf16 operands, f32 accumulators),
4 warps per block; block and tile sizes per head size are in TILES below:
- forward: a block per 128 query rows (two 16-row tiles per warp); tiles of 64 keys and values
  (32 for D = 128) arrive by `cp.async` into a double buffer while the warps compute s = q k^T,
  update the running max and sum per row (the 4 threads of a row combine with shuffles),
  rescale o and add p v, with p converted to the operand dtype in registers (the accumulator
  layout of s is the A layout of p). Key tiles past the diagonal are never loaded; the diagonal
  tile and the edges are masked. It writes o / l and the base-2 logsumexp m + log2(l) of every
  row, [N, T, D + 1] in f32, or (no gradient in the graph) o / l alone in the operand dtype.
- dq: a block per 64 query rows; per key tile it recomputes p = exp2(s c - lse), dp = do v^T and
  ds = p (dp - rowsum(do o)), and adds ds k. Both backward kernels write their gradients in
  the operand dtype.
- dk, dv: a block per 64 keys; per query tile (64 rows, 32 for D = 128 so the accumulators fit
  in registers) it computes s^T = k q^T directly (keys as rows, so p^T and ds^T are A operands
  with no transpose), then adds p^T do to dv and ds^T q to dk.
Shared-memory tiles are rows of D 16-bit values in 16-byte chunks, the chunk index XORed with
the row (eight rows one `ldmatrix` reads fall in eight bank groups).
On sm_90a (`Kernel.hopper`) every product is wgmma (`EmberWg<true>`): scores from tiles in the
128-byte-swizzled layout (`ember_hswz`), and p (or ds) kept in registers as the A operand of
the product that follows, the other operand read transposed. The three kernels are the ones
above with HOPPER set: the forward with two warpgroups of 64 rows (128 a block; tiles of 128
keys at D = 64, HOPPER_TILE), dq and dk|dv with one. SASS: HGMMA only, 8, 12 and 16 a tile for
the forward (tiles of 64 keys), dq and dk|dv; 90-126 (forward, 128-key tiles), 126 and 174
registers at D = 64; no local memory. Measured on the H200 (docs/performance.md).

On sm_90a the three kernels are warp-specialized (`ember_flash_*_ws`, FlashAttention-3's plan;
`EMBER_FLASH_WS=0` renders the ones above instead, as does a q, k or v that does not split by
one head count): a producer warpgroup (24 registers) copies the block's own rows once and
streams the other side's tiles by TMA (tensor maps of q, k, v and do as [N / H, H, rows, D],
`tma_layouts`) through mbarrier-guarded slots, and two consumer warpgroups of 64 rows (240
registers) take turns at issuing their products (named barriers), so one's softmax overlaps
the other's products. The forward is persistent (a block an SM, items from a counter).

f32 operands (tensor cores would round them) take three kernels of their own on CUDA cores
(`ember_flash32_*`, sizes in TILES32): G = D / 16 neighbouring threads hold a row, 16 of its
values each in registers; every thread of a block reads the same key (or query) row of a
shared-memory tile at once, a broadcast, and a row's dot products are summed over its G threads
with shuffles. The forward holds two query rows a thread (each key loaded serves both) and
updates the running max every 16 keys; dq and dk|dv hold one row. 96-134 registers, no local
memory. A causal block skips the tiles past its last row but computes its diagonal tiles whole,
masked: skipping per warp inside a tile made ptxas keep a divergent copy of the shuffles
(BRA.DIV) and spill.
"""
from __future__ import annotations

import math
import os

from ..compiler.lower import Kernel
from .mma import wgmma_helper  # mma.helpers brings the descriptors and fences
from .render import CLike, KernelWriter

THREADS = 128

HELPERS = r"""
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
/* element offset of (row, 16-byte chunk) in a tile of rows of D values */
template <int D> EMBER_D int ember_swz(int row, int chunk) { return (row * (D / 8) + (chunk ^ (row & 7))) * 8; }
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
/* the next tile of two [nrows][D] matrices into the other slot of their double buffers (none
   after the last), then wait until this tile's have arrived */
template <int D, int ROWS, bool HOPPER = false, typename E>
EMBER_D void ember_next_tiles(E* a, const E* ga, int lda, E* b, const E* gb, int ldb, int t, int tiles, int nrows) {
  if (t + 1 < tiles) {
    ember_tile_load<D, ROWS, HOPPER>(a + ((t + 1) & 1) * ROWS * D, ga, (t + 1) * ROWS, nrows, lda);
    ember_tile_load<D, ROWS, HOPPER>(b + ((t + 1) & 1) * ROWS * D, gb, (t + 1) * ROWS, nrows, ldb);
  }
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
/* acc[NT][4] += A (16 x 16 BK, in registers as accumulators of 16 x 8 tiles) * B (BK x 8 NT) from
   a tile whose rows are k */
template <int D, int BK, int NT, bool BF16> EMBER_D void ember_acc_pt(float (*acc)[4], float (*p)[4],
                                                                     const unsigned short* s) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++) {
    unsigned a[4] = {ember_pack2<BF16>(p[2 * kk][0], p[2 * kk][1]), ember_pack2<BF16>(p[2 * kk][2], p[2 * kk][3]),
                     ember_pack2<BF16>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                     ember_pack2<BF16>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dd = 0; dd < NT / 2; dd++) {
      unsigned b[4];
      ember_frag_bt<D>(b, s, kk * 16, dd * 16);
      ember_mma16816<BF16>(acc[2 * dd], a, b);
      ember_mma16816<BF16>(acc[2 * dd + 1], a, b + 2);
    }
  }
}
/* s[m][BN/8][4] = A (WM tiles of 16 rows from row0, all D columns, from tile sa) * B^T (BN rows
   of tile sb): each B fragment loaded once serves the WM row tiles */
template <int D, int BN, int WM, bool BF16>
EMBER_D void ember_scores(float (*s)[BN / 8][4], const unsigned short* sa, int row0, const unsigned short* sb) {
#pragma unroll
  for (int m = 0; m < WM; m++)
#pragma unroll
    for (int n = 0; n < BN / 8; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    unsigned a[WM][4];
#pragma unroll
    for (int m = 0; m < WM; m++) ember_frag_a<D>(a[m], sa, row0 + 16 * m, kk);
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

/* The same two products for one warpgroup on sm_90a (HOPPER): EmberWg<true> (flash.py's sm_90a
   helpers, only in a source that has such kernels) does them with wgmma from tiles in
   ember_hswz's layout. Their fragments are laid out as the mma.sync ones, so the kernels'
   element code is shared. */
template <bool HOPPER> struct EmberWg;
template <int D, int BN, int WM, bool BF16, bool HOPPER>
EMBER_D void ember_scores_any(float (*s)[BN / 8][4], const unsigned short* sa, int rows_a, const unsigned short* sb) {
  if constexpr (HOPPER) EmberWg<HOPPER>::template scores<D, BN, BF16>(&s[0][0][0], sa, rows_a, sb);
  else ember_scores<D, BN, WM, BF16>(s, sa, (threadIdx.x >> 5) * 16 * WM, sb);
}
template <int D, int BK, int NT, bool BF16, bool HOPPER>
EMBER_D void ember_acc_any(float (*acc)[4], float (*p)[4], const unsigned short* sb) {
  if constexpr (HOPPER) EmberWg<HOPPER>::template acc<D, BK, BF16>(&acc[0][0], p, sb);
  else ember_acc_pt<D, BK, NT, BF16>(acc, p, sb);
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

/* One 16-row tile's step of the online softmax over BN keys from col0: the scores s (this
   thread's 2 rows r_lo and r_lo + 8, in the accumulator layout) masked where they pass S or the
   diagonal (edge tiles only), the running max m and sum l updated (the 4 threads of a row combine
   with shuffles), o rescaled, and s replaced by the weights exp2(s c - m). */
template <int BN, int NT, bool CAUSAL>
EMBER_D void ember_flash_online(float (*s)[4], float* m, float* l, float (*o)[4], int col0, int r_lo, int S, float c,
                                bool edge) {
  const int lane = threadIdx.x & 31;
  if (edge) {
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int col = col0 + n * 8 + (lane & 3) * 2 + (e & 1), row = r_lo + (e >> 1) * 8;
        if (col >= S || (CAUSAL && col > row)) s[n][e] = -INFINITY;
      }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float mx = m[h];
#pragma unroll
    for (int n = 0; n < BN / 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]) * c);
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
        s[n][e] = ember_ex2(fmaf(s[n][e], c, -base));
        sum += s[n][e];
      }
    l[h] = l[h] * r + sum;
#pragma unroll
    for (int x = 0; x < NT; x++) { o[x][2 * h] *= r; o[x][2 * h + 1] *= r; }
  }
}
/* rows r_lo and r_lo + 8 of the forward's output: f32 rows of D + 1 (o / l, then the base-2
   logsumexp m + log2(l)), or o / l alone rounded once to the operand dtype (OUT 16-bit: a
   forward with no gradient taken; nothing reads the logsumexp, no kernel converts o after) */
template <int D, typename OUT> EMBER_D constexpr int ember_flash_width() { return sizeof(OUT) == 4 ? D + 1 : D; }
template <int D, bool BF16, typename OUT>
EMBER_D void ember_flash_out(OUT* out, float (*o)[4], float* m, float* l, int r_lo, int T) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = r_lo + h * 8;
    if (row >= T) continue;
    const float inv = 1.f / l[h];
    OUT* dst = out + (size_t)row * ember_flash_width<D, OUT>();
#pragma unroll
    for (int x = 0; x < D / 8; x++) {
      if constexpr (sizeof(OUT) == 4) {   /* odd rows: no pairs */
        dst[x * 8 + (lane & 3) * 2] = o[x][2 * h] * inv;
        dst[x * 8 + (lane & 3) * 2 + 1] = o[x][2 * h + 1] * inv;
      } else {
        ember_store2<BF16>(dst + x * 8 + (lane & 3) * 2, o[x][2 * h] * inv, o[x][2 * h + 1] * inv);
      }
    }
    if constexpr (sizeof(OUT) == 4)
      if ((lane & 3) == 0) dst[D] = m[h] + log2f(l[h]);
  }
}

/* ROWS query rows per block, TILE keys per tile. mma.sync: 4 warps, ROWS / 64 tiles of 16 rows
   per warp (each K fragment loaded from shared memory serves them all). HOPPER (sm_90a): two
   warpgroups of 64 rows (warp w: rows 16 w.. of the block, in the fragment layout of mma.sync's
   accumulators); s = q k^T is wgmma from shared memory, and p stays in registers as the A
   operand of o += p v, whose B (v, contiguous along D) is read transposed. */
template <int D, int ROWS, int TILE, bool CAUSAL, bool BF16, bool HOPPER = false, typename OUT>
EMBER_D void ember_flash_fwd(OUT* out, const unsigned short* q, const unsigned short* k,
                             const unsigned short* v, int ldq, int ldk, int ldv, int T, int S, float c) {
  constexpr int BM = ROWS, BN = TILE, WM = HOPPER ? 1 : ROWS / 64, NT = D / 8;
  unsigned short *sq = ember_flash_tiles<HOPPER>(), *sk = sq + BM * D, *sv = sk + 2 * BN * D;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;  /* longest rows first */
  int tiles = (S + BN - 1) / BN;
  if (CAUSAL) tiles = min(tiles, (row0 + BM - 1) / BN + 1);
  ember_tile_load<D, BM, HOPPER>(sq, q, row0, T, ldq);
  ember_tile_load<D, BN, HOPPER>(sk, k, 0, S, ldk);
  ember_tile_load<D, BN, HOPPER>(sv, v, 0, S, ldv);
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
  for (int t = 0; t < tiles; t++) {
    ember_next_tiles<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const unsigned short *ck = sk + (t & 1) * BN * D, *cv = sv + (t & 1) * BN * D;
    float s[WM][BN / 8][4];
    ember_scores_any<D, BN, WM, BF16, HOPPER>(s, HOPPER ? sq + (warp >> 2) * 64 * 64 : sq, BM, ck);
    const bool edge = t * BN + BN > S || (CAUSAL && t * BN + BN - 1 > row0);
#pragma unroll
    for (int w = 0; w < WM; w++)
      ember_flash_online<BN, NT, CAUSAL>(s[w], m[w], l[w], o[w], t * BN, r_lo + 16 * w, S, c, edge);
#pragma unroll
    for (int w = 0; w < WM; w++) ember_acc_any<D, BN, NT, BF16, HOPPER>(o[w], s[w], cv);
    __syncthreads();   /* this slot is filled again two tiles on */
  }
#pragma unroll
  for (int w = 0; w < WM; w++)
    ember_flash_out<D, BF16>(out + (size_t)nb * T * ember_flash_width<D, OUT>(), o[w], m[w], l[w], r_lo + 16 * w, T);
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

/* p = exp2(s c - lse) and ds = p (dp - di) for the 2 rows (ROWS_ARE_KEYS: 2 key rows, so the
   columns are queries) and BN columns of this thread; masked entries (EDGE tiles: past T, S or
   the diagonal) are 0, as scores of -inf (c > 0). Only edge tiles pay for the masks and for
   clamping the rows of lse and di they read: the others' loads are at fixed offsets. */
template <int BN, bool CAUSAL, bool ROWS_ARE_KEYS, bool EDGE>
EMBER_D void ember_flash_ds_tile(float (*s)[4], float (*dp)[4], float c, int r_lo, int col0, int T, int S,
                                 const float* lse, int lse_stride, const float* di) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < BN / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int row = r_lo + (e >> 1) * 8, col = col0 + n * 8 + (lane & 3) * 2 + (e & 1);
      int i = ROWS_ARE_KEYS ? col : row;
      const int j = ROWS_ARE_KEYS ? row : col;
      if (EDGE && (i >= T || j >= S || (CAUSAL && j > i))) s[n][e] = -INFINITY;
      if (EDGE) i = min(i, T - 1);
      const float p = ember_ex2(fmaf(s[n][e], c, -lse[(size_t)i * lse_stride]));
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - di[i]);
    }
}
/* a branch, not a select per element: ptxas keeps both versions of the tile */
template <int BN, bool CAUSAL, bool ROWS_ARE_KEYS>
EMBER_D void ember_flash_ds(float (*s)[4], float (*dp)[4], float c, int r_lo, int col0, int T, int S,
                            const float* lse, int lse_stride, const float* di, bool edge) {
  if (edge)
    ember_flash_ds_tile<BN, CAUSAL, ROWS_ARE_KEYS, true>(s, dp, c, r_lo, col0, T, S, lse, lse_stride, di);
  else
    ember_flash_ds_tile<BN, CAUSAL, ROWS_ARE_KEYS, false>(s, dp, c, r_lo, col0, T, S, lse, lse_stride, di);
}

template <int D, int ROWS, int TILE, bool CAUSAL, bool BF16, bool HOPPER, typename OUT>
EMBER_D void ember_flash_dq(OUT* out, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                            const float* packed, const unsigned short* dout, const float* di, int ldq, int ldk,
                            int ldv, int T, int S, float c, float cs) {
  constexpr int BM = ROWS, BN = TILE, NT = D / 8;
  unsigned short *sq = ember_flash_tiles<HOPPER>(), *sdo = sq + BM * D, *sk = sdo + BM * D, *sv = sk + 2 * BN * D;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
  int tiles = (S + BN - 1) / BN;
  if (CAUSAL) tiles = min(tiles, (row0 + BM - 1) / BN + 1);
  ember_tile_load<D, BM, HOPPER>(sq, q, row0, T, ldq);
  ember_tile_load<D, BM, HOPPER>(sdo, dout, row0, T, D);
  ember_tile_load<D, BN, HOPPER>(sk, k, 0, S, ldk);
  ember_tile_load<D, BN, HOPPER>(sv, v, 0, S, ldv);
  ember_cp_async_commit();
  float acc[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.f;
  const int r_lo = row0 + warp * 16 + (lane >> 2);
  for (int t = 0; t < tiles; t++) {
    ember_next_tiles<D, BN, HOPPER>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const unsigned short *ck = sk + (t & 1) * BN * D, *cv = sv + (t & 1) * BN * D;
    float s[1][BN / 8][4], dp[1][BN / 8][4];
    ember_scores_any<D, BN, 1, BF16, HOPPER>(s, sq, BM, ck);
    ember_scores_any<D, BN, 1, BF16, HOPPER>(dp, sdo, BM, cv);
    const bool edge = row0 + BM > T || t * BN + BN > S || (CAUSAL && t * BN + BN - 1 > row0);
    ember_flash_ds<BN, CAUSAL, false>(s[0], dp[0], c, r_lo, t * BN, T, S, packed + D, D + 1, di, edge);
    ember_acc_any<D, BN, NT, BF16, HOPPER>(acc, dp[0], ck);
    __syncthreads();
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * T * D, acc, r_lo, T, D, cs);
}

template <int D, int ROWS, int TILE, bool CAUSAL, bool BF16, bool HOPPER, typename OUT>
EMBER_D void ember_flash_dkdv(OUT* out, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                              const float* packed, const unsigned short* dout, const float* di, int ldq, int ldk,
                              int ldv, int T, int S, float c, float cs) {
  constexpr int BN = ROWS, BM = TILE, NT = D / 8;   /* BN keys per block, BM queries per tile */
  unsigned short *sk = ember_flash_tiles<HOPPER>(), *sv = sk + BN * D, *sq = sv + BN * D, *sdo = sq + 2 * BM * D;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key0 = blockIdx.x * BN;
  const int first = CAUSAL ? key0 / BM : 0, tiles = (T + BM - 1) / BM;
  ember_tile_load<D, BN, HOPPER>(sk, k, key0, S, ldk);
  ember_tile_load<D, BN, HOPPER>(sv, v, key0, S, ldv);
  if (first < tiles) {
    ember_tile_load<D, BM, HOPPER>(sq + (first & 1) * BM * D, q, first * BM, T, ldq);
    ember_tile_load<D, BM, HOPPER>(sdo + (first & 1) * BM * D, dout, first * BM, T, D);
  }
  ember_cp_async_commit();
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.f;
  const int r_lo = key0 + warp * 16 + (lane >> 2);   /* this thread's key rows */
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, BM, HOPPER>(sq, q, ldq, sdo, dout, D, t, tiles, T);
    const unsigned short *cq = sq + (t & 1) * BM * D, *cdo = sdo + (t & 1) * BM * D;
    float s[1][BM / 8][4], dp[1][BM / 8][4];
    ember_scores_any<D, BM, 1, BF16, HOPPER>(s, sk, BN, cq);     /* s^T: keys x queries */
    ember_scores_any<D, BM, 1, BF16, HOPPER>(dp, sv, BN, cdo);   /* dp^T = v do^T */
    const bool edge = t * BM + BM > T || key0 + BN > S || (CAUSAL && key0 + BN - 1 > t * BM);
    ember_flash_ds<BM, CAUSAL, true>(s[0], dp[0], c, r_lo, t * BM, T, S, packed + D, D + 1, di, edge);
    ember_acc_any<D, BM, NT, BF16, HOPPER>(dv, s[0], cdo);
    ember_acc_any<D, BM, NT, BF16, HOPPER>(dk, dp[0], cq);
    __syncthreads();
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * S * 2 * D, dk, r_lo, S, 2 * D, cs);
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * S * 2 * D + D, dv, r_lo, S, 2 * D, 1.f);
}
"""


F32 = r"""
/* ---- flash attention on f32 operands, on CUDA cores (backend/flash.py) ---- */
/* G = D / 16 neighbouring threads hold a row, 16 values each: float4 c of thread g is columns
   4 (c G + g)..+3, so the G threads of a row read 16 G consecutive bytes together */
template <int D> EMBER_D void ember_row32(float* r, const float* row) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    *(float4*)(r + 4 * c) = *(const float4*)(row + 4 * (c * (D / 16) + threadIdx.x % (D / 16)));
}
template <int D> EMBER_D void ember_row32_store(float* row, const float* r, float scale) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    *(float4*)(row + 4 * (c * (D / 16) + threadIdx.x % (D / 16))) =
        make_float4(r[4 * c] * scale, r[4 * c + 1] * scale, r[4 * c + 2] * scale, r[4 * c + 3] * scale);
}
EMBER_D float ember_dot16(const float* a, const float* b) {   /* this thread's part of a dot product */
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < 16; e++) acc = fmaf(a[e], b[e], acc);
  return acc;
}
template <int D> EMBER_D float ember_row_total(float x) {   /* summed over the G threads of the row */
#pragma unroll
  for (int o = 1; o < D / 16; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
/* this thread's parts of the dot products of two rows it holds with KC rows of two tiles:
   s[j] = a . ta[j], dp[j] = b . tb[j] */
template <int D, int KC> EMBER_D void ember_dots32(float* s, float* dp, const float* a, const float* ta, const float* b,
                                                   const float* tb) {
#pragma unroll
  for (int j = 0; j < KC; j++) {
    float x[16];
    ember_row32<D>(x, ta + j * D);
    s[j] = ember_dot16(a, x);
    ember_row32<D>(x, tb + j * D);
    dp[j] = ember_dot16(b, x);
  }
}
EMBER_D void ember_axpy16(float* acc, float a, const float* x) {
#pragma unroll
  for (int e = 0; e < 16; e++) acc[e] = fmaf(a, x[e], acc[e]);
}

/* The forward: 128 threads, two query rows per G threads (a key loaded once serves both), ROWS
   = 256 / G rows a block. Every thread reads the same key at once (a broadcast); keys and values
   arrive in tiles of TILE through a double buffer, and the running max and sum are updated
   every 16 keys. Writes what ember_flash_fwd writes. */
template <int D, int ROWS, int TILE, bool CAUSAL>
EMBER_D void ember_flash32_fwd(float* out, const float* q, const float* k, const float* v, int ldq, int ldk,
                               int ldv, int T, int S, float c) {
  constexpr int G = D / 16, KC = 16;
  float *sk = (float*)ember_flash_tiles<false>(), *sv = sk + 2 * TILE * D;
  const int nb = blockIdx.y, row0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ROWS;
  const int r0 = row0 + threadIdx.x / G * 2;   /* this thread's rows: r0 and r0 + 1 */
  int tiles = (S + TILE - 1) / TILE;
  if (CAUSAL) tiles = min(tiles, (row0 + ROWS - 1) / TILE + 1);
  ember_tile_load<D, TILE>(sk, k, 0, S, ldk);
  ember_tile_load<D, TILE>(sv, v, 0, S, ldv);
  ember_cp_async_commit();
  float qr[2][16], o[2][16], m[2], l[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 16; e++) qr[h][e] = o[h][e] = 0.f;
    if (r0 + h < T) ember_row32<D>(qr[h], q + (size_t)(r0 + h) * ldq);
  }
  for (int t = 0; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const float *ck = sk + (t & 1) * TILE * D, *cv = sv + (t & 1) * TILE * D;
#pragma unroll 1
    for (int j0 = 0; j0 < TILE; j0 += KC) {
      const int col0 = t * TILE + j0;
      float s[2][KC];
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[16];
        ember_row32<D>(x, ck + (j0 + j) * D);
        s[0][j] = ember_dot16(qr[0], x);
        s[1][j] = ember_dot16(qr[1], x);
      }
      const bool edge = col0 + KC > S || (CAUSAL && col0 + KC - 1 > r0);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = m[h];
#pragma unroll
        for (int j = 0; j < KC; j++) {
          s[h][j] = ember_row_total<D>(s[h][j]) * c;
          if (edge && (col0 + j >= S || (CAUSAL && col0 + j > r0 + h))) s[h][j] = -INFINITY;
          mx = fmaxf(mx, s[h][j]);
        }
        const float base = mx == -INFINITY ? 0.f : mx;   /* no key seen yet: every weight is 0 */
        const float r = ember_ex2(m[h] - base);
        m[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < KC; j++) {
          s[h][j] = ember_ex2(s[h][j] - base);
          sum += s[h][j];
        }
        l[h] = l[h] * r + sum;
#pragma unroll
        for (int e = 0; e < 16; e++) o[h][e] *= r;
      }
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[16];
        ember_row32<D>(x, cv + (j0 + j) * D);
        ember_axpy16(o[0], s[0][j], x);
        ember_axpy16(o[1], s[1][j], x);
      }
    }
    __syncthreads();   /* this slot is filled again two tiles on */
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = r0 + h;
    if (row >= T) continue;
    float* dst = out + ((size_t)nb * T + row) * (D + 1);
    const float inv = 1.f / l[h];
#pragma unroll
    for (int c4 = 0; c4 < 4; c4++)
#pragma unroll
      for (int e = 0; e < 4; e++) dst[4 * (c4 * G + threadIdx.x % G) + e] = o[h][4 * c4 + e] * inv;
    if (threadIdx.x % G == 0) dst[D] = m[h] + log2f(l[h]);
  }
}

/* The backward on f32 operands: a row (a query's for dq, a key's for dk|dv) per G threads, ROWS
   = 128 / G a block, the other side's rows streamed through a double buffer in tiles of TILE
   and taken 8 at a time: p = exp2(s c - lse), ds = p (dp - rowsum(do o)). */
template <int D, int ROWS, int TILE, bool CAUSAL>
EMBER_D void ember_flash32_dq(float* out, const float* q, const float* k, const float* v, const float* packed,
                              const float* dout, const float* di, int ldq, int ldk, int ldv, int T, int S,
                              float c, float cs) {
  constexpr int G = D / 16, KC = 8;
  float *sk = (float*)ember_flash_tiles<false>(), *sv = sk + 2 * TILE * D;
  const int nb = blockIdx.y, row0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ROWS;
  const int row = row0 + threadIdx.x / G;
  const bool live = row < T;
  int tiles = (S + TILE - 1) / TILE;
  if (CAUSAL) tiles = min(tiles, (row0 + ROWS - 1) / TILE + 1);
  ember_tile_load<D, TILE>(sk, k, 0, S, ldk);
  ember_tile_load<D, TILE>(sv, v, 0, S, ldv);
  ember_cp_async_commit();
  float qr[16], dor[16], acc[16];
#pragma unroll
  for (int e = 0; e < 16; e++) qr[e] = dor[e] = acc[e] = 0.f;
  if (live) {
    ember_row32<D>(qr, q + (size_t)row * ldq);
    ember_row32<D>(dor, dout + (size_t)row * D);
  }
  const float lse = live ? packed[(size_t)row * (D + 1) + D] : 0.f, dd = live ? di[row] : 0.f;
  for (int t = 0; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sk, k, ldk, sv, v, ldv, t, tiles, S);
    const float *ck = sk + (t & 1) * TILE * D, *cv = sv + (t & 1) * TILE * D;
#pragma unroll 1
    for (int j0 = 0; j0 < TILE; j0 += KC) {
      const int col0 = t * TILE + j0;
      float s[KC], dp[KC];
      ember_dots32<D, KC>(s, dp, qr, ck + j0 * D, dor, cv + j0 * D);
#pragma unroll
      for (int j = 0; j < KC; j++) {
        const float sj = ember_row_total<D>(s[j]), dpj = ember_row_total<D>(dp[j]);   /* every lane shuffles */
        const bool ok = live && col0 + j < S && (!CAUSAL || col0 + j <= row);
        s[j] = ok ? ember_ex2(fmaf(sj, c, -lse)) * (dpj - dd) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < KC; j++) {
        float x[16];
        ember_row32<D>(x, ck + (j0 + j) * D);
        ember_axpy16(acc, s[j], x);
      }
    }
    __syncthreads();
  }
  if (live) ember_row32_store<D>(out + ((size_t)nb * T + row) * D, acc, cs);
}

template <int D, int ROWS, int TILE, bool CAUSAL>
EMBER_D void ember_flash32_dkdv(float* out, const float* q, const float* k, const float* v, const float* packed,
                                const float* dout, const float* di, int ldq, int ldk, int ldv, int T, int S,
                                float c, float cs) {
  constexpr int G = D / 16, KC = 8;
  float *sq = (float*)ember_flash_tiles<false>(), *sdo = sq + 2 * TILE * D;
  const int nb = blockIdx.y, key0 = blockIdx.x * ROWS, key = key0 + threadIdx.x / G;
  const bool live = key < S;
  const int first = CAUSAL ? key0 / TILE : 0, tiles = (T + TILE - 1) / TILE;
  if (first < tiles) {
    ember_tile_load<D, TILE>(sq + (first & 1) * TILE * D, q, first * TILE, T, ldq);
    ember_tile_load<D, TILE>(sdo + (first & 1) * TILE * D, dout, first * TILE, T, D);
  }
  ember_cp_async_commit();
  float kr[16], vr[16], dk[16], dv[16];
#pragma unroll
  for (int e = 0; e < 16; e++) kr[e] = vr[e] = dk[e] = dv[e] = 0.f;
  if (live) {
    ember_row32<D>(kr, k + (size_t)key * ldk);
    ember_row32<D>(vr, v + (size_t)key * ldv);
  }
  for (int t = first; t < tiles; t++) {
    ember_next_tiles<D, TILE>(sq, q, ldq, sdo, dout, D, t, tiles, T);
    const float *cq = sq + (t & 1) * TILE * D, *cdo = sdo + (t & 1) * TILE * D;
#pragma unroll 1
    for (int i0 = 0; i0 < TILE; i0 += KC) {
      const int qi0 = t * TILE + i0;
      float s[KC], dp[KC];
      ember_dots32<D, KC>(s, dp, kr, cq + i0 * D, vr, cdo + i0 * D);
#pragma unroll
      for (int i = 0; i < KC; i++) {
        const int qi = qi0 + i;
        const float si = ember_row_total<D>(s[i]), dpi = ember_row_total<D>(dp[i]);   /* every lane shuffles */
        const bool ok = live && qi < T && (!CAUSAL || key <= qi);
        s[i] = ok ? ember_ex2(fmaf(si, c, -packed[(size_t)qi * (D + 1) + D])) : 0.f;
        dp[i] = ok ? s[i] * (dpi - di[qi]) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < KC; i++) {
        float x[16];
        ember_row32<D>(x, cdo + (i0 + i) * D);
        ember_axpy16(dv, s[i], x);
        ember_row32<D>(x, cq + (i0 + i) * D);
        ember_axpy16(dk, dp[i], x);
      }
    }
    __syncthreads();
  }
  if (live) {
    ember_row32_store<D>(out + ((size_t)nb * S + key) * 2 * D, dk, cs);
    ember_row32_store<D>(out + ((size_t)nb * S + key) * 2 * D + D, dv, 1.f);
  }
}
"""


HOPPER = r"""
/* ---- flash attention on wgmma (sm_90a, backend/flash.py) ---- */
/* s = A B^T (A: 64 rows of a tile of rows_a, B: BN rows), both from shared memory; and
   acc += P B, P in registers as wgmma's A operand (mma.sync's A fragments), B (BK rows of D,
   contiguous along D) read transposed */
template <> struct EmberWg<true> {
  /* issued and committed, not waited for (ember_flash_fwd_ws waits after passing its turn on) */
  template <int D, int BN, bool BF16>
  static __device__ void scores_issue(float* s, const unsigned short* sa, int rows_a, const unsigned short* sb) {
    ember_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)   /* the first step overwrites s: no zeroing */
      ember_wgmma_s<BN, BF16>(s, ember_desc(sa + (kk >> 2) * rows_a * 64 + (kk & 3) * 16, 16, 1024),
                              ember_desc(sb + (kk >> 2) * BN * 64 + (kk & 3) * 16, 16, 1024), kk > 0);
    ember_wgmma_commit();
  }
  template <int D, int BN, bool BF16>
  static __device__ void scores(float* s, const unsigned short* sa, int rows_a, const unsigned short* sb) {
    scores_issue<D, BN, BF16>(s, sa, rows_a, sb);
    ember_wgmma_wait<0>();
  }
  template <int D, int BK, bool BF16>
  static __device__ void acc(float* acc, float (*p)[4], const unsigned short* sb) {
    acc_issue<D, BK, BF16>(acc, p, sb);
    ember_wgmma_wait<0>();
  }
  template <int D, int BK, bool BF16>
  static __device__ void acc_issue(float* acc, float (*p)[4], const unsigned short* sb) {
    unsigned a[BK / 16][4];   /* every A fragment packed before the fence (PTX: registers a wgmma
                                 reads are written before wgmma.fence, not between it and the wgmma) */
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      a[kk][0] = ember_pack2<BF16>(p[2 * kk][0], p[2 * kk][1]);
      a[kk][1] = ember_pack2<BF16>(p[2 * kk][2], p[2 * kk][3]);
      a[kk][2] = ember_pack2<BF16>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
      a[kk][3] = ember_pack2<BF16>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    }
    ember_wgmma_fence();   /* a and acc were written by ordinary instructions */
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++)
      ember_wgmma_pv<D, BF16>(acc, a[kk], ember_desc(sb + kk * 16 * 64, BK * 128, 1024));
    ember_wgmma_commit();
  }
};

/* rows [r0, r0 + ROWS) of batch nb of q, k or v (a [N / heads, heads, rows, D] tensor map) by
   TMA, as ember_hswz<ROWS> lays a tile out: one box per 64-column panel */
template <int D, int ROWS> EMBER_D void ember_flash_tma_tile(unsigned short* dst, const EmberTmap* map, int r0, int nb,
                                                             int heads, unsigned long long* bar) {
#pragma unroll
  for (int p = 0; p < D / 64; p++) ember_tma4(dst + p * ROWS * 64, map, 64 * p, r0, nb % heads, nb / heads, bar);
}

/* The forward on sm_90a, warp-specialized (FlashAttention-3's plan) and persistent: 384
   threads, a block per SM taking (128-row block, head) items in turn, blockIdx.x first, then
   the next of a counter in global memory (`next`: [0] items handed out past the grid, [1] blocks
   done; the last block done puts both back to 0 for the next launch). Items go row blocks
   first, causal ones longest first, so a block that finishes early takes the next.
   Warpgroup 0 gives its registers away and one of its threads takes the items and copies each
   one's q and its tiles of TILE keys and values by TMA into STAGES slots; each slot has a
   "full" mbarrier (its bytes arrived) and an "empty" one (both consumers' products with it are
   done), and q has a pair too, so the next item's q and first tiles arrive while the consumers
   write this item's rows. Warpgroups 1 and 2 own 64 rows each and take turns at issuing their
   products (named barriers 1 and 2): while one computes its softmax, the tensor cores run the
   other's products. The element code is ember_flash_fwd's. */
template <int D, int TILE, int STAGES, bool CAUSAL, bool BF16, typename OUT>
EMBER_D void ember_flash_fwd_ws(OUT* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                                int n, int heads, int T, int S, float c, unsigned* next) {
  constexpr int BM = 128, BN = TILE, NT = D / 8;
  unsigned short *sq = ember_flash_tiles<true>(), *sk = sq + BM * D, *sv = sk + STAGES * BN * D;
  __shared__ __align__(8) unsigned long long bars[2 * STAGES + 2];
  __shared__ int item;   /* the item whose q qfull announces; items or more: none is left */
  unsigned long long *full = bars, *empty = bars + STAGES, *qfull = bars + 2 * STAGES, *qempty = qfull + 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int blocks = (T + BM - 1) / BM, items = blocks * n;
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; st++) { ember_mbar_init(&full[st], 1); ember_mbar_init(&empty[st], 8); }
    ember_mbar_init(qfull, 1);
    ember_mbar_init(qempty, 8);
  }
  __syncthreads();
  if (warp < 4) {   /* the producer */
    ember_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    for (int w = blockIdx.x, i = 0, g = 0;; i++) {   /* g: tiles so far */
      ember_mbar_wait(qempty, (i & 1) ^ 1);   /* the consumers are done with the last item's q */
      item = w;
      if (w >= items) { ember_mbar_arrive(qfull); break; }
      const int nb = w / blocks, row0 = (CAUSAL ? blocks - 1 - w % blocks : w % blocks) * BM;
      const int tiles = CAUSAL ? min((S + BN - 1) / BN, (row0 + BM - 1) / BN + 1) : (S + BN - 1) / BN;
      ember_mbar_expect(qfull, BM * D * 2);
      ember_flash_tma_tile<D, BM>(sq, tq, row0, nb, heads, qfull);
      for (int t = 0; t < tiles; t++, g++) {
        const int st = g % STAGES, ph = (g / STAGES) & 1;
        ember_mbar_wait(&empty[st], ph ^ 1);
        ember_mbar_expect(&full[st], 2 * BN * D * 2);
        ember_flash_tma_tile<D, BN>(sk + st * BN * D, tk, t * BN, nb, heads, &full[st]);
        ember_flash_tma_tile<D, BN>(sv + st * BN * D, tv, t * BN, nb, heads, &full[st]);
      }
      w = gridDim.x + atomicAdd(&next[0], 1);
    }
    __threadfence();
    if (atomicAdd(&next[1], 1) == gridDim.x - 1) next[0] = next[1] = 0;
    return;
  }
  ember_setmaxnreg_inc<240>();
  const int wg = (warp >> 2) - 1;   /* rows 64 wg.. of the block */
  const unsigned short* myq = sq + wg * 64 * 64;
  if (wg == 1) ember_bar_arrive(1, 256);   /* warpgroup 1 issues first */
  for (int i = 0, g = 0;; i++) {
    ember_mbar_wait(qfull, i & 1);
    const int w = item;
    if (w >= items) break;
    const int nb = w / blocks, row0 = (CAUSAL ? blocks - 1 - w % blocks : w % blocks) * BM;
    const int tiles = CAUSAL ? min((S + BN - 1) / BN, (row0 + BM - 1) / BN + 1) : (S + BN - 1) / BN;
    float o[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int x = 0; x < NT; x++) o[x][0] = o[x][1] = o[x][2] = o[x][3] = 0.f;
    const int r_lo = row0 + (warp - 4) * 16 + (lane >> 2);
    for (int t = 0; t < tiles; t++, g++) {
      const int st = g % STAGES, ph = (g / STAGES) & 1;
      const unsigned short *ck = sk + st * BN * D, *cv = sv + st * BN * D;
      ember_mbar_wait(&full[st], ph);
      float s[BN / 8][4];
      ember_bar_sync(1 + wg, 256);   /* my turn */
      EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], myq, BM, ck);
      ember_bar_arrive(2 - wg, 256);   /* the other's turn */
      ember_wgmma_wait<0>();
      if (t + 1 == tiles && lane == 0) ember_mbar_arrive(qempty);   /* q (and item) read for the last time */
      const bool edge = t * BN + BN > S || (CAUSAL && t * BN + BN - 1 > row0);
      ember_flash_online<BN, NT, CAUSAL>(s, m, l, o, t * BN, r_lo, S, c, edge);
      ember_bar_sync(1 + wg, 256);
      EmberWg<true>::template acc_issue<D, BN, BF16>(&o[0][0], s, cv);
      ember_bar_arrive(2 - wg, 256);
      ember_wgmma_wait<0>();
      if (lane == 0) ember_mbar_arrive(&empty[st]);
    }
    ember_flash_out<D, BF16>(out + (size_t)nb * T * ember_flash_width<D, OUT>(), o, m, l, r_lo, T);
  }
  if (wg == 0) ember_bar_sync(1, 256);   /* warpgroup 1's last turn-passing, never taken */
}

/* The backward's producer (one thread): the block's own two matrices a and b (rows r0.. of
   OWN) once, on mbarrier own, then c and d in tiles of TILE rows, first to tiles, through
   STAGES slots of full and empty mbarriers. */
template <int D, int OWN, int TILE, int STAGES>
EMBER_D void ember_flash_produce(unsigned short* sa, const EmberTmap* ta, unsigned short* sb, const EmberTmap* tb,
                                 int r0, unsigned long long* own, unsigned short* sc, const EmberTmap* tc,
                                 unsigned short* sd, const EmberTmap* td, int first, int tiles,
                                 unsigned long long* full, unsigned long long* empty, int nb, int heads) {
  ember_mbar_expect(own, 2 * OWN * D * 2);
  ember_flash_tma_tile<D, OWN>(sa, ta, r0, nb, heads, own);
  ember_flash_tma_tile<D, OWN>(sb, tb, r0, nb, heads, own);
  for (int t = first; t < tiles; t++) {
    const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
    ember_mbar_wait(&empty[st], ph ^ 1);
    ember_mbar_expect(&full[st], 2 * TILE * D * 2);
    ember_flash_tma_tile<D, TILE>(sc + st * TILE * D, tc, t * TILE, nb, heads, &full[st]);
    ember_flash_tma_tile<D, TILE>(sd + st * TILE * D, td, t * TILE, nb, heads, &full[st]);
  }
}

/* The backward's two kernels warp-specialized as ember_flash_fwd_ws: warpgroups 1 and 2 own 64
   of the block's 128 rows each (queries for dq, keys for dk|dv), copied once by TMA with do (dq)
   or v (dk|dv); the other side's two matrices stream through STAGES slots in tiles of TILE
   rows, and the consumers take turns at issuing each tile's first products (the scores and dp,
   together) and its last ones. */
template <int D, int TILE, int STAGES, bool CAUSAL, bool BF16, typename OUT>
EMBER_D void ember_flash_dq_ws(OUT* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                               const EmberTmap* tdo, const float* packed, const float* di, int heads, int T, int S,
                               float c, float cs) {
  constexpr int BM = 128, BN = TILE, NT = D / 8;
  unsigned short *sq = ember_flash_tiles<true>(), *sdo = sq + BM * D, *sk = sdo + BM * D, *sv = sk + STAGES * BN * D;
  __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
  unsigned long long *full = bars, *empty = bars + STAGES, *own = bars + 2 * STAGES;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM;
  int tiles = (S + BN - 1) / BN;
  if (CAUSAL) tiles = min(tiles, (row0 + BM - 1) / BN + 1);
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; st++) { ember_mbar_init(&full[st], 1); ember_mbar_init(&empty[st], 8); }
    ember_mbar_init(own, 1);
  }
  __syncthreads();
  if (warp < 4) {   /* the producer */
    ember_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    ember_flash_produce<D, BM, BN, STAGES>(sq, tq, sdo, tdo, row0, own, sk, tk, sv, tv, 0, tiles, full, empty, nb,
                                           heads);
    return;
  }
  ember_setmaxnreg_inc<240>();
  const int wg = (warp >> 2) - 1;
  const int r_lo = row0 + (warp - 4) * 16 + (lane >> 2);
  float acc[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.f;
  ember_mbar_wait(own, 0);
  if (wg == 1) ember_bar_arrive(1, 256);
  for (int t = 0; t < tiles; t++) {
    const int st = t % STAGES, ph = (t / STAGES) & 1;
    const unsigned short *ck = sk + st * BN * D, *cv = sv + st * BN * D;
    ember_mbar_wait(&full[st], ph);
    float s[BN / 8][4], dp[BN / 8][4];
    ember_bar_sync(1 + wg, 256);
    EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], sq + wg * 64 * 64, BM, ck);
    EmberWg<true>::template scores_issue<D, BN, BF16>(&dp[0][0], sdo + wg * 64 * 64, BM, cv);
    ember_bar_arrive(2 - wg, 256);
    ember_wgmma_wait<0>();
    const bool edge = row0 + BM > T || t * BN + BN > S || (CAUSAL && t * BN + BN - 1 > row0);
    ember_flash_ds<BN, CAUSAL, false>(s, dp, c, r_lo, t * BN, T, S, packed + D, D + 1, di, edge);
    ember_bar_sync(1 + wg, 256);
    EmberWg<true>::template acc_issue<D, BN, BF16>(&acc[0][0], dp, ck);
    if (wg == 0 || t + 1 < tiles) ember_bar_arrive(2 - wg, 256);
    ember_wgmma_wait<0>();
    if (lane == 0) ember_mbar_arrive(&empty[st]);
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * T * D, acc, r_lo, T, D, cs);
}

template <int D, int TILE, int STAGES, bool CAUSAL, bool BF16, typename OUT>
EMBER_D void ember_flash_dkdv_ws(OUT* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                                 const EmberTmap* tdo, const float* packed, const float* di, int heads, int T, int S,
                                 float c, float cs) {
  constexpr int BN = 128, BM = TILE, NT = D / 8;   /* BN keys per block, BM queries per tile */
  unsigned short *sk = ember_flash_tiles<true>(), *sv = sk + BN * D, *sq = sv + BN * D, *sdo = sq + STAGES * BM * D;
  __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
  unsigned long long *full = bars, *empty = bars + STAGES, *own = bars + 2 * STAGES;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key0 = blockIdx.x * BN;
  const int first = CAUSAL ? key0 / BM : 0, tiles = (T + BM - 1) / BM;
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; st++) { ember_mbar_init(&full[st], 1); ember_mbar_init(&empty[st], 8); }
    ember_mbar_init(own, 1);
  }
  __syncthreads();
  if (warp < 4) {   /* the producer */
    ember_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    ember_flash_produce<D, BN, BM, STAGES>(sk, tk, sv, tv, key0, own, sq, tq, sdo, tdo, first, tiles, full, empty, nb,
                                           heads);
    return;
  }
  ember_setmaxnreg_inc<240>();
  const int wg = (warp >> 2) - 1;
  const int r_lo = key0 + (warp - 4) * 16 + (lane >> 2);   /* this thread's key rows */
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.f;
  ember_mbar_wait(own, 0);
  if (wg == 1 && first < tiles) ember_bar_arrive(1, 256);
  for (int t = first; t < tiles; t++) {
    const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
    const unsigned short *cq = sq + st * BM * D, *cdo = sdo + st * BM * D;
    ember_mbar_wait(&full[st], ph);
    float s[BM / 8][4], dp[BM / 8][4];
    ember_bar_sync(1 + wg, 256);
    EmberWg<true>::template scores_issue<D, BM, BF16>(&s[0][0], sk + wg * 64 * 64, BN, cq);    /* s^T */
    EmberWg<true>::template scores_issue<D, BM, BF16>(&dp[0][0], sv + wg * 64 * 64, BN, cdo);  /* dp^T */
    ember_bar_arrive(2 - wg, 256);
    ember_wgmma_wait<0>();
    const bool edge = t * BM + BM > T || key0 + BN > S || (CAUSAL && key0 + BN - 1 > t * BM);
    ember_flash_ds<BM, CAUSAL, true>(s, dp, c, r_lo, t * BM, T, S, packed + D, D + 1, di, edge);
    ember_bar_sync(1 + wg, 256);
    EmberWg<true>::template acc_issue<D, BM, BF16>(&dv[0][0], s, cdo);
    EmberWg<true>::template acc_issue<D, BM, BF16>(&dk[0][0], dp, cq);
    if (wg == 0 || t + 1 < tiles) ember_bar_arrive(2 - wg, 256);
    ember_wgmma_wait<0>();
    if (lane == 0) ember_mbar_arrive(&empty[st]);
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * S * 2 * D, dk, r_lo, S, 2 * D, cs);
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * S * 2 * D + D, dv, r_lo, S, 2 * D, 1.f);
}
"""


def tma_ranks(kernels: list[Kernel]) -> set[int]:
    """The warp-specialized forward copies q, k and v as 4-d tensors (mma.helpers writes the copy)."""
    return {4 for k in kernels if k.fused is not None and ws_heads(k) is not None}


def _hopper_helpers(kernels: list[Kernel]) -> str:
    """The wgmma instructions sm_90a's flash kernels use, as the templates ember_wgmma_s<N, BF16>
    (scores: N columns, both operands from shared memory) and ember_wgmma_pv<D, BF16> (A in
    registers, B transposed), and the EmberWg<true> that does the kernels' products with them."""
    hopper = [k for k in kernels if k.hopper and k.fused is not None]
    if not hopper:
        return ""
    scores, products = set(), set()
    for k in hopper:
        d = _sizes(k)[6]
        dtype = k.fused[0].srcs[0].dtype.name
        scores.add((dtype, _plan(k)[1]))
        products.add((dtype, d))
    out = ("template <int N, bool BF16> EMBER_D void ember_wgmma_s(float* d, unsigned long long da, "
           "unsigned long long db, int acc);\n"
           "template <int N, bool BF16> EMBER_D void ember_wgmma_pv(float* d, const unsigned* a, "
           "unsigned long long db);\n")
    for dtype, n in sorted(scores):
        out += wgmma_helper(dtype, n, 0, 0, f"ember_wgmma_s_{dtype}_n{n}")
        out += (f"template <> __device__ inline void ember_wgmma_s<{n}, {str(dtype == 'bf16').lower()}>(float* d, "
                f"unsigned long long da, unsigned long long db, int acc) {{\n"
                f"  ember_wgmma_s_{dtype}_n{n}(d, da, db, acc);\n}}\n")
    for dtype, d in sorted(products):
        # p (registers) times v (shared memory, contiguous along d: read transposed)
        out += wgmma_helper(dtype, d, 0, 1, f"ember_wgmma_rs_{dtype}_n{d}", a_in_registers=True)
        out += (f"template <> __device__ inline void ember_wgmma_pv<{d}, {str(dtype == 'bf16').lower()}>(float* d, "
                f"const unsigned* a, unsigned long long db) {{ ember_wgmma_rs_{dtype}_n{d}(d, a, db); }}\n")
    return out + HOPPER


def helpers(kernels: list[Kernel]) -> str:
    fused = [k for k in kernels if k.fused is not None]
    if not fused:
        return ""
    return HELPERS + (F32 if any(_f32(k) for k in fused) else "") + _hopper_helpers(kernels)


def _f32(k: Kernel) -> bool:
    """Whether a flash kernel takes f32 operands (CUDA cores: tensor cores would round them)."""
    assert k.fused is not None
    return k.fused[0].srcs[0].dtype.name == "f32"


def _sizes(k: Kernel) -> tuple[str, bool, float, int, int, int, int]:
    assert k.fused is not None
    node = k.fused[0]
    kind, causal, c = node.arg
    n, t_len, d = node.srcs[0].shape
    return kind, causal, c, n, t_len, node.srcs[1].shape[1], d


# kind -> head size -> (rows a block owns, rows of each tile streamed past them), the templates'
# ROWS and TILE: the forward's block is 2 tiles of 16 query rows per warp, so each K fragment
# loaded serves both; D = 128 streams shorter tiles where the accumulators would not fit in
# registers otherwise
TILES = {"attention": {64: (128, 64), 128: (128, 32)},
         "attention_dq": {64: (64, 64), 128: (64, 64)},
         "attention_dkdv": {64: (64, 64), 128: (64, 32)}}


HOPPER_ROWS, HOPPER_THREADS = 128, 256   # sm_90a's forward: two warpgroups of 64 rows
HOPPER_TILE = {64: 128, 128: 64}   # its keys per tile, by head size (D = 128: 160 KB of tiles at 128, one block an SM)


# f32 operands (CUDA cores): kind -> head size -> (rows a block owns, rows of each tile streamed
# past them); the forward's threads hold two rows each, the backward's one; 32 KB of tiles
TILES32 = {"attention": {64: (64, 32), 128: (32, 16)},
           "attention_dq": {64: (32, 32), 128: (16, 16)},
           "attention_dkdv": {64: (32, 32), 128: (16, 16)}}


# the warp-specialized kernels (ember_flash_*_ws, sm_90a): 128 rows a block, tiles of this many
# rows streamed past them (the forward's keys; the backward's keys for dq, queries for dk|dv)
WS_TILE = {"attention": 128, "attention_dq": 64, "attention_dkdv": 64}
WS_STAGES, WS_THREADS = 2, 384
# which of a kernel's sources it copies once (its block's rows) and which it streams by tiles
WS_OWN = {"attention": (0,), "attention_dq": (0, 4), "attention_dkdv": (1, 2)}
WS_TILED = {"attention": (1, 2), "attention_dq": (1, 2), "attention_dkdv": (0, 4)}


def ws_heads(k: Kernel) -> int | None:
    """The heads H the warp-specialized kernels see q, k, v (and do) in (each a [N / H, H, rows,
    D] tensor for TMA), or None where they do not apply: only sm_90a's f16/bf16 kernels, and only
    when every operand's batch axis splits by one H (a View's own heads, or 1)."""
    if not k.hopper or _f32(k) or os.environ.get("EMBER_FLASH_WS") == "0":   # 0: the cp.async kernels
        return None
    assert k.fused is not None
    heads = {v.heads for v in k.fused[2][:3] if v is not None and v.heads > 1}
    return heads.pop() if len(heads) <= 1 and heads else 1 if not heads else None


def _plan(k: Kernel) -> tuple[int, int, int]:
    """(rows a block owns, rows a tile streams, threads a block)."""
    kind, _, _, _, _, _, d = _sizes(k)
    if _f32(k):
        return (*TILES32[kind][d], THREADS)
    if ws_heads(k) is not None:
        return HOPPER_ROWS, WS_TILE[kind], WS_THREADS
    if k.hopper and kind == "attention":
        return HOPPER_ROWS, HOPPER_TILE[d], HOPPER_THREADS
    return (*TILES[kind][d], THREADS)


def _ws_sources(k: Kernel) -> list[int]:
    """The sources the warp-specialized kernel reads by TMA, in its tensor maps' order: q, k, v,
    and do for the backward."""
    return [0, 1, 2] if _sizes(k)[0] == "attention" else [0, 1, 2, 4]


def tma_layouts(k: Kernel) -> list[tuple[int, int, list[int], list[int]]]:
    """How the warp-specialized kernels' TMA sees q, k, v (and do): for each, (its buffer's id,
    the element offset of its first element, dims [D, rows, H, N / H] innermost first, and the
    element strides of the last three). Element (n, r, d) sits at offset + (n // H) * strides[2]
    + (n % H) * strides[1] + r * strides[0] + d."""
    assert k.fused is not None
    node, bufs, views = k.fused
    heads = ws_heads(k)
    assert heads is not None
    out = []
    for i in _ws_sources(k):
        (n, rows, d), b, view = node.srcs[i].shape, bufs[i], views[i]
        if view is None:
            offset, strides = 0, [d, rows * d, heads * rows * d]
        elif view.heads > 1:
            offset, strides = view.offset, [view.ld, view.sh, view.sb]
        else:   # batch n at n * sb: head n % H, batch n // H
            offset, strides = view.offset, [view.ld, view.sb, heads * view.sb]
        out.append((b.id, offset, [d, rows, heads, n // heads], strides))
    return out


def tensor_maps(k: Kernel, ptr: dict[int, int]) -> list:
    """The warp-specialized kernels' CUtensorMaps for buffers at ptr (tma_layouts): boxes of 64
    columns x the rows a block owns or a tile streams, in the 128-byte swizzle ember_hswz lays
    tiles out in; zeros past the edges."""
    from cuda.bindings import driver as cu
    assert k.fused is not None
    kinds = {"bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "f16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    kind = _sizes(k)[0]
    rows, tile, _ = _plan(k)
    maps = []
    for i, (buf, offset, dims, strides) in zip(_ws_sources(k), tma_layouts(k)):
        box = [64, rows if i in WS_OWN[kind] else tile, 1, 1]
        err, tmap = cu.cuTensorMapEncodeTiled(
            kinds[k.fused[0].srcs[i].dtype.name], 4, ptr[buf] + 2 * offset, [cu.cuuint64_t(x) for x in dims],
            [cu.cuuint64_t(x * 2) for x in strides], [cu.cuuint32_t(x) for x in box], [cu.cuuint32_t(1)] * 4,
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if int(err) != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled for {k.name}: {err} (dims {dims}, strides {strides})")
        maps.append(tmap)
    return maps


def smem_bytes(k: Kernel) -> int:
    """f16/bf16: the forward keeps its block's q, the backward kernels two matrices (q and do; k
    and v); each streams two matrices through double buffers (the warp-specialized kernels
    through WS_STAGES slots). The sm_90a tiles start on 1024 bytes (the swizzle's period). f32:
    only the two streamed matrices (a thread's own rows are in its registers)."""
    kind, _, _, _, _, _, d = _sizes(k)
    rows, tile, _ = _plan(k)
    if _f32(k):
        return 4 * tile * d * 4
    own = (1 if kind == "attention" else 2) * rows
    if ws_heads(k) is not None:
        return (own + 2 * WS_STAGES * tile) * d * 2 + 1024
    return (own + 4 * tile) * d * 2 + 1024 * k.hopper


def launch(k: Kernel, sms: int) -> tuple[tuple[int, int, int], int, int]:
    kind, _, _, n, t_len, s_len, d = _sizes(k)
    rows, _, threads = _plan(k)
    blocks = -(-(s_len if kind == "attention_dkdv" else t_len) // rows)
    if kind == "attention" and ws_heads(k) is not None:   # persistent: a block per SM at most
        return (min(blocks * n, sms), 1, 1), threads, smem_bytes(k)
    return (blocks, n, 1), threads, smem_bytes(k)


def render(r: CLike, k: Kernel, prefix: str = "") -> str:
    """The kernel's entry point: its buffers in `Kernel.args` order, each source placed at the
    block's batch (q, k and v where their View says, the others in order) and handed to the
    template with the row strides of q, k and v."""
    assert k.fused is not None
    node, bufs, views = k.fused
    kind, causal, c, _, t_len, s_len, d = _sizes(k)
    bf16 = node.srcs[0].dtype.name == "bf16"
    signature = KernelWriter(r, k, prefix).signature()[len("void "):]
    args = []
    for src, b, view in zip(node.srcs, bufs, views):
        if view is None:
            args.append(f"b{b.id} + (size_t)nb * {math.prod(src.shape[1:])}")
        else:
            args.append(f"b{b.id} + {view.offset} + (size_t)(nb / {view.heads}) * {view.sb} + "
                        f"(size_t)(nb % {view.heads}) * {view.sh}")
    lds = [str(v.ld if v else d) for v in views[:3]]
    call = ", ".join(args + lds)
    extra = "" if kind == "attention" else f", {c * math.log(2.0)!r}f"   # the backward's scale of ds
    fn = {"attention": "fwd", "attention_dq": "dq", "attention_dkdv": "dkdv"}[kind]
    fn = f"ember_flash32_{fn}" if _f32(k) else f"ember_flash_{fn}"
    rows, tile, threads = _plan(k)
    heads = ws_heads(k)
    if heads is not None:   # q, k, v (and do) by TMA: the tensor maps follow the buffers, by value
        maps = ["tq", "tk", "tv", "tdo"][:len(_ws_sources(k))]
        # the forward's items (row blocks x heads) count n; the backward's: the packed output, rowsum(do o)
        rest = f"{_sizes(k)[3]}, " if kind == "attention" else f"{args[3]}, {args[5]}, "
        name = signature.split("(")[0].strip()
        # the forward's item counter, zero when the module loads and put back by each launch
        counter = f"__device__ unsigned {name}_next[2];\n" if kind == "attention" else ""
        extra += f", {name}_next" if kind == "attention" else ""
        return (counter + f"extern \"C\" __global__ void __launch_bounds__({threads}, 1) {signature[:-1]}, "
                + ", ".join(f"const __grid_constant__ EmberTmap {m}" for m in maps) + ") {\n"
                "  const int nb = blockIdx.y;\n"
                f"  {fn}_ws<{d}, {tile}, {WS_STAGES}, {str(causal).lower()}, {str(bf16).lower()}>(b{k.out.id}, "
                f"{', '.join('&' + m for m in maps)}, {rest}{heads}, {t_len}, {s_len}, {c!r}f{extra});\n}}\n")
    flags = str(causal).lower() if _f32(k) else f"{str(causal).lower()}, {str(bf16).lower()}, {str(k.hopper).lower()}"
    return (f"extern \"C\" __global__ void __launch_bounds__({threads}) {signature} {{\n"
            "  const int nb = blockIdx.y;\n"
            f"  {fn}<{d}, {rows}, {tile}, {flags}>(b{k.out.id}, {call}, {t_len}, "
            f"{s_len}, {c!r}f{extra});\n}}\n")
