
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
    pack<BK, BF16>(a, p);
    acc_issue_packed<D, BK, BF16>(acc, a, sb);
  }
  template <int BK, bool BF16>
  static __device__ void pack(unsigned (*a)[4], float (*p)[4]) {
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      a[kk][0] = ember_pack2<BF16>(p[2 * kk][0], p[2 * kk][1]);
      a[kk][1] = ember_pack2<BF16>(p[2 * kk][2], p[2 * kk][3]);
      a[kk][2] = ember_pack2<BF16>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
      a[kk][3] = ember_pack2<BF16>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    }
  }
  template <int D, int BK, bool BF16>
  static __device__ void acc_issue_packed(float* acc, unsigned (*a)[4], const unsigned short* sb) {
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
  for (int p = 0; p < ember_pitch<D, true>() / 64; p++)   /* a panel past D: TMA's zeros */ ember_tma4(dst + p * ROWS * 64, map, 64 * p, r0, nb % heads, nb / heads, bar);
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
template <int D, int TILE, int STAGES, bool BF16, bool LSE, typename SM>
EMBER_D void ember_flash_fwd_ws(unsigned short* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                                int n, int heads, int group, int kv_heads, int T, int S, unsigned* next, const SM& sm) {
  constexpr int BM = 128, BN = TILE, NT = ember_cols<D, true>() / 8, P = ember_pitch<D, true>();
  unsigned short *sq = ember_flash_tiles<true>(), *sk = sq + BM * P, *sv = sk + STAGES * BN * P;
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
      const int nb = w / blocks, row0 = (blocks - 1 - w % blocks) * BM;
      const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);
      ember_mbar_expect(qfull, BM * P * 2);   /* whole boxes, zeros past D included */
      ember_flash_tma_tile<D, BM>(sq, tq, row0, nb, heads, qfull);
      for (int t = span.x; t < span.y; t++, g++) {
        const int st = g % STAGES, ph = (g / STAGES) & 1;
        ember_mbar_wait(&empty[st], ph ^ 1);
        ember_mbar_expect(&full[st], 2 * BN * P * 2);
        ember_flash_tma_tile<D, BN>(sk + st * BN * P, tk, t * BN, nb / group, kv_heads, &full[st]);
        ember_flash_tma_tile<D, BN>(sv + st * BN * P, tv, t * BN, nb / group, kv_heads, &full[st]);
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
    const int nb = w / blocks, row0 = (blocks - 1 - w % blocks) * BM;
    const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);
    const int tiles = span.y;
    float o[NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int x = 0; x < NT; x++) o[x][0] = o[x][1] = o[x][2] = o[x][3] = 0.f;
    const int r_lo = row0 + (warp - 4) * 16 + (lane >> 2);
    if (span.x == tiles && lane == 0) ember_mbar_arrive(qempty);   /* no tile: q is not read */
    /* a turn issues this tile's scores and the last tile's p v (FlashAttention-3's pipelining
       within a warpgroup): the softmax of tile t runs while the tensor cores do the product of
       t - 1 and the other warpgroup's; o is rescaled once that product is waited for. The first
       tile and the last product are peeled off the loop: with a product issued under a condition,
       ptxas could not tell which accumulators were ready and serialized every wgmma. */
    unsigned pa[BN / 16][4];   /* the last tile's p, as wgmma's A fragments */
    int last = g % STAGES;     /* the last tile's slot */
    if (span.x < tiles) {
      ember_mbar_wait(&full[last], (g / STAGES) & 1);
      float s[BN / 8][4];
      ember_bar_sync(1 + wg, 256);   /* my turn */
      EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], myq, BM, sk + last * BN * P);
      ember_bar_arrive(2 - wg, 256);   /* the other's turn */
      ember_wgmma_wait<0>();
      if (span.x + 1 == tiles && lane == 0) ember_mbar_arrive(qempty);   /* q (and item) read for the last time */
      const bool edge = ember_flash_edge<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, span.x * BN, S);
      ember_flash_online<BN, NT>(s, m, l, o, sm, nb, span.x * BN, r_lo, T, S, edge);
      EmberWg<true>::template pack<BN, BF16>(pa, s);
      g++;
      for (int t = span.x + 1; t < tiles; t++, g++) {
        const int st = g % STAGES, ph = (g / STAGES) & 1;
        ember_mbar_wait(&full[st], ph);
        float s[BN / 8][4], r[2];
        ember_bar_sync(1 + wg, 256);
        EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], myq, BM, sk + st * BN * P);
        EmberWg<true>::template acc_issue_packed<8 * NT, BN, BF16>(&o[0][0], pa, sv + last * BN * P);
        ember_bar_arrive(2 - wg, 256);
        ember_wgmma_wait<1>();   /* the scores (committed first) */
        if (t + 1 == tiles && lane == 0) ember_mbar_arrive(qempty);
        const bool edge = ember_flash_edge<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, t * BN, S);
        ember_flash_online<BN, NT, SM, true>(s, m, l, o, sm, nb, t * BN, r_lo, T, S, edge, r);
        ember_wgmma_wait<0>();   /* the last tile's p v */
        if (lane == 0) ember_mbar_arrive(&empty[last]);
#pragma unroll
        for (int x = 0; x < NT; x++) { o[x][0] *= r[0]; o[x][1] *= r[0]; o[x][2] *= r[1]; o[x][3] *= r[1]; }
        EmberWg<true>::template pack<BN, BF16>(pa, s);
        last = st;
      }
      ember_bar_sync(1 + wg, 256);   /* the last tile's p v */
      EmberWg<true>::template acc_issue_packed<8 * NT, BN, BF16>(&o[0][0], pa, sv + last * BN * P);
      ember_bar_arrive(2 - wg, 256);
      ember_wgmma_wait<0>();
      if (lane == 0) ember_mbar_arrive(&empty[last]);
    }
    ember_flash_out<D, BF16, LSE>(out + (size_t)nb * T * ember_flash_width<D, LSE>(), o, m, l, r_lo, T);
  }
  if (wg == 0) ember_bar_sync(1, 256);   /* warpgroup 1's last turn-passing, never taken */
}

/* The backward's producer (one thread): the block's own two matrices a and b (rows r0.. of
   OWN, batch nb_own of heads_own) once, on mbarrier own, then c and d (batch nb_tiled of
   heads_tiled) in tiles of TILE rows, first to tiles, through STAGES slots of full and empty
   mbarriers. k and v are at batch nb / group of kv_heads (grouped-query attention). */
template <int D, int OWN, int TILE, int STAGES>
EMBER_D void ember_flash_produce(unsigned short* sa, const EmberTmap* ta, unsigned short* sb, const EmberTmap* tb,
                                 int r0, unsigned long long* own, unsigned short* sc, const EmberTmap* tc,
                                 unsigned short* sd, const EmberTmap* td, int first, int tiles,
                                 unsigned long long* full, unsigned long long* empty, int nb_own, int heads_own,
                                 int nb_tiled, int heads_tiled) {
  constexpr int P = ember_pitch<D, true>();
  ember_mbar_expect(own, 2 * OWN * P * 2);
  ember_flash_tma_tile<D, OWN>(sa, ta, r0, nb_own, heads_own, own);
  ember_flash_tma_tile<D, OWN>(sb, tb, r0, nb_own, heads_own, own);
  for (int t = first; t < tiles; t++) {
    const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
    ember_mbar_wait(&empty[st], ph ^ 1);
    ember_mbar_expect(&full[st], 2 * TILE * P * 2);
    ember_flash_tma_tile<D, TILE>(sc + st * TILE * P, tc, t * TILE, nb_tiled, heads_tiled, &full[st]);
    ember_flash_tma_tile<D, TILE>(sd + st * TILE * P, td, t * TILE, nb_tiled, heads_tiled, &full[st]);
  }
}

/* The backward's two kernels warp-specialized as ember_flash_fwd_ws: warpgroups 1 and 2 own 64
   of the block's 128 rows each (queries for dq, keys for dk|dv), copied once by TMA with do (dq)
   or v (dk|dv); the other side's two matrices stream through STAGES slots in tiles of TILE
   rows, and the consumers take turns at issuing each tile's first products (the scores and dp,
   together) and its last ones. */
template <int D, int TILE, int STAGES, bool BF16, bool DGRAD, typename OUT, typename SM>
EMBER_D void ember_flash_dq_ws(OUT* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                               const EmberTmap* tdo, const unsigned short* packed, const float* di, int heads, int group,
                               int kv_heads, int T, int S, float cs, const SM& sm) {
  constexpr int BM = 128, BN = TILE, NT = ember_cols<D, true>() / 8, P = ember_pitch<D, true>();
  unsigned short *sq = ember_flash_tiles<true>(), *sdo = sq + BM * P, *sk = sdo + BM * P, *sv = sk + STAGES * BN * P;
  __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
  unsigned long long *full = bars, *empty = bars + STAGES, *own = bars + 2 * STAGES;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * BM;
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; st++) { ember_mbar_init(&full[st], 1); ember_mbar_init(&empty[st], 8); }
    ember_mbar_init(own, 1);
  }
  __syncthreads();
  if (warp < 4) {   /* the producer */
    ember_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);
    ember_flash_produce<D, BM, BN, STAGES>(sq, tq, sdo, tdo, row0, own, sk, tk, sv, tv, span.x, span.y, full, empty,
                                           nb, heads, nb / group, kv_heads);
    return;
  }
  ember_setmaxnreg_inc<240>();
  const int2 span = ember_flash_span<BN, false>(sm, nb, row0, min(row0 + BM, T) - 1, S);   /* after the split */
  const int first = span.x, tiles = span.y;
  const int wg = (warp >> 2) - 1;
  const int r_lo = row0 + (warp - 4) * 16 + (lane >> 2);
  float acc[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++) acc[x][0] = acc[x][1] = acc[x][2] = acc[x][3] = 0.f;
  const unsigned short *myq = sq + wg * 64 * 64, *mydo = sdo + wg * 64 * 64;
  auto ds = [&](float (*s)[4], float (*dp)[4], int t) {
    const bool edge = ember_flash_past<BM>(row0 + BM - 1, T) ||
                      ember_flash_edge<BN, false>(sm, nb, row0, row0 + BM - 1, t * BN, S);
    ember_flash_ds<BN, BM, false, DGRAD>(s, dp, sm, nb, r_lo, t * BN, T, S, ember_lse<D>(packed), ember_lse_ld<D>(), di, edge);
  };
  ember_mbar_wait(own, 0);
  if (first < tiles) {
    if (wg == 1) ember_bar_arrive(1, 256);   /* warpgroup 0 issues first */
    /* a turn issues tile t's scores and dp and tile t - 1's ds k (the forward's pipelining): ds
       of t is computed while the tensor cores do the product of t - 1. The first tile's scores
       and the last tile's product take turns of their own (no product under a condition: C7514) */
    unsigned pa[BN / 16][4];   /* the last tile's ds, as wgmma's A fragments */
    int last = 0;              /* its slot */
    {
      float s[BN / 8][4], dp[BN / 8][4];
      ember_mbar_wait(&full[0], 0);
      ember_bar_sync(1 + wg, 256);
      EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], myq, BM, sk);
      EmberWg<true>::template scores_issue<D, BN, BF16>(&dp[0][0], mydo, BM, sv);
      ember_bar_arrive(2 - wg, 256);
      ember_wgmma_wait<0>();
      ds(s, dp, first);
      EmberWg<true>::template pack<BN, BF16>(pa, dp);
    }
    for (int t = first + 1; t < tiles; t++) {
      const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
      float s[BN / 8][4], dp[BN / 8][4];
      ember_mbar_wait(&full[st], ph);
      ember_bar_sync(1 + wg, 256);
      EmberWg<true>::template scores_issue<D, BN, BF16>(&s[0][0], myq, BM, sk + st * BN * P);
      EmberWg<true>::template scores_issue<D, BN, BF16>(&dp[0][0], mydo, BM, sv + st * BN * P);
      EmberWg<true>::template acc_issue_packed<8 * NT, BN, BF16>(&acc[0][0], pa, sk + last * BN * P);
      ember_bar_arrive(2 - wg, 256);
      ember_wgmma_wait<1>();   /* the scores and dp (committed first) */
      ds(s, dp, t);
      ember_wgmma_wait<0>();   /* the last tile's ds k */
      if (lane == 0) ember_mbar_arrive(&empty[last]);
      EmberWg<true>::template pack<BN, BF16>(pa, dp);
      last = st;
    }
    ember_bar_sync(1 + wg, 256);   /* the last tile's ds k */
    EmberWg<true>::template acc_issue_packed<8 * NT, BN, BF16>(&acc[0][0], pa, sk + last * BN * P);
    if (wg == 0) ember_bar_arrive(2, 256);   /* warpgroup 1 has no turn left to pass on */
    ember_wgmma_wait<0>();
    if (lane == 0) ember_mbar_arrive(&empty[last]);
  }
  ember_flash_rows_out<D, BF16>(out + (size_t)nb * T * D, acc, r_lo, T, D, cs);
}

template <int D, int TILE, int STAGES, bool BF16, bool DGRAD, int DC = D, typename OUT, typename SM>
EMBER_D void ember_flash_dkdv_ws(OUT* out, const EmberTmap* tq, const EmberTmap* tk, const EmberTmap* tv,
                                 const EmberTmap* tdo, const unsigned short* packed, const float* di, int heads, int group,
                                 int kv_heads, int T, int S, float cs, const SM& sm) {
  constexpr int BN = 128, BM = TILE, NT = ember_cols<DC, true>() / 8, P = ember_pitch<D, true>();
  unsigned short *sk = ember_flash_tiles<true>(), *sv = sk + BN * P, *sq = sv + BN * P, *sdo = sq + STAGES * BM * P;
  const int c0 = DC == D ? 0 : blockIdx.z * DC;   /* BN keys per block, BM queries per tile, columns c0.. of dk and dv (ember_flash_dkdv) */
  __shared__ __align__(8) unsigned long long bars[2 * STAGES + 1];
  unsigned long long *full = bars, *empty = bars + STAGES, *own = bars + 2 * STAGES;
  const int nb = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key0 = blockIdx.x * BN;
  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; st++) { ember_mbar_init(&full[st], 1); ember_mbar_init(&empty[st], 8); }
    ember_mbar_init(own, 1);
  }
  __syncthreads();
  if (warp < 4) {   /* the producer */
    ember_setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    const int2 span = ember_flash_span<BM, true>(sm, nb, key0, min(key0 + BN, S) - 1, T);
    ember_flash_produce<D, BN, BM, STAGES>(sk, tk, sv, tv, key0, own, sq, tq, sdo, tdo, span.x, span.y, full, empty,
                                           nb / group, kv_heads, nb, heads);
    return;
  }
  ember_setmaxnreg_inc<240>();
  const int2 span = ember_flash_span<BM, true>(sm, nb, key0, min(key0 + BN, S) - 1, T);   /* after the split */
  const int first = span.x, tiles = span.y;
  const int wg = (warp >> 2) - 1;
  const int r_lo = key0 + (warp - 4) * 16 + (lane >> 2);   /* this thread's key rows */
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int x = 0; x < NT; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.f;
  const unsigned short *myk = sk + wg * 64 * 64, *myv = sv + wg * 64 * 64;
  auto ds = [&](float (*s)[4], float (*dp)[4], int t) {
    const bool edge = ember_flash_past<BN>(key0 + BN - 1, S) ||
                      ember_flash_edge<BM, true>(sm, nb, key0, key0 + BN - 1, t * BM, T);
    ember_flash_ds<BM, BN, true, DGRAD>(s, dp, sm, nb, r_lo, t * BM, T, S, ember_lse<D>(packed), ember_lse_ld<D>(), di, edge);
  };
  ember_mbar_wait(own, 0);
  if (first < tiles) {
    if (wg == 1) ember_bar_arrive(1, 256);   /* warpgroup 0 issues first */
    if constexpr (NT * 8 <= 64) {
      /* pipelined as ember_flash_dq_ws: a turn issues tile t's s^T and dp^T and tile t - 1's
         p^T do and ds^T q. Not with 128 columns of accumulators: two tiles' operands beside
         them spilled (f16, D = 96: 144 bytes) */
      unsigned pp[BM / 16][4], pd[BM / 16][4];   /* the last tile's p^T and ds^T */
      int last = 0;
      {
        float s[BM / 8][4], dp[BM / 8][4];
        ember_mbar_wait(&full[0], 0);
        ember_bar_sync(1 + wg, 256);
        EmberWg<true>::template scores_issue<D, BM, BF16>(&s[0][0], myk, BN, sq);
        EmberWg<true>::template scores_issue<D, BM, BF16>(&dp[0][0], myv, BN, sdo);
        ember_bar_arrive(2 - wg, 256);
        ember_wgmma_wait<0>();
        ds(s, dp, first);
        EmberWg<true>::template pack<BM, BF16>(pp, s);
        EmberWg<true>::template pack<BM, BF16>(pd, dp);
      }
      for (int t = first + 1; t < tiles; t++) {
        const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
        const unsigned short *lq = sq + last * BM * P + c0 / 64 * BM * 64, *ldo = sdo + last * BM * P + c0 / 64 * BM * 64;
        float s[BM / 8][4], dp[BM / 8][4];
        ember_mbar_wait(&full[st], ph);
        ember_bar_sync(1 + wg, 256);
        EmberWg<true>::template scores_issue<D, BM, BF16>(&s[0][0], myk, BN, sq + st * BM * P);
        EmberWg<true>::template scores_issue<D, BM, BF16>(&dp[0][0], myv, BN, sdo + st * BM * P);
        EmberWg<true>::template acc_issue_packed<8 * NT, BM, BF16>(&dv[0][0], pp, ldo);
        EmberWg<true>::template acc_issue_packed<8 * NT, BM, BF16>(&dk[0][0], pd, lq);
        ember_bar_arrive(2 - wg, 256);
        ember_wgmma_wait<2>();   /* s^T and dp^T (committed first) */
        ds(s, dp, t);
        ember_wgmma_wait<0>();   /* the last tile's products */
        if (lane == 0) ember_mbar_arrive(&empty[last]);
        EmberWg<true>::template pack<BM, BF16>(pp, s);
        EmberWg<true>::template pack<BM, BF16>(pd, dp);
        last = st;
      }
      ember_bar_sync(1 + wg, 256);   /* the last tile's products */
      EmberWg<true>::template acc_issue_packed<8 * NT, BM, BF16>(&dv[0][0], pp, sdo + last * BM * P + c0 / 64 * BM * 64);
      EmberWg<true>::template acc_issue_packed<8 * NT, BM, BF16>(&dk[0][0], pd, sq + last * BM * P + c0 / 64 * BM * 64);
      if (wg == 0) ember_bar_arrive(2, 256);   /* warpgroup 1 has no turn left to pass on */
      ember_wgmma_wait<0>();
      if (lane == 0) ember_mbar_arrive(&empty[last]);
    } else {
      for (int t = first; t < tiles; t++) {
        const int st = (t - first) % STAGES, ph = ((t - first) / STAGES) & 1;
        const unsigned short *cq = sq + st * BM * P, *cdo = sdo + st * BM * P;
        float s[BM / 8][4], dp[BM / 8][4];
        ember_mbar_wait(&full[st], ph);
        ember_bar_sync(1 + wg, 256);
        EmberWg<true>::template scores_issue<D, BM, BF16>(&s[0][0], myk, BN, cq);    /* s^T */
        EmberWg<true>::template scores_issue<D, BM, BF16>(&dp[0][0], myv, BN, cdo);  /* dp^T */
        ember_bar_arrive(2 - wg, 256);
        ember_wgmma_wait<0>();
        ds(s, dp, t);
        ember_bar_sync(1 + wg, 256);
        EmberWg<true>::template acc_issue<8 * NT, BM, BF16>(&dv[0][0], s, cdo + c0 / 64 * BM * 64);
        EmberWg<true>::template acc_issue<8 * NT, BM, BF16>(&dk[0][0], dp, cq + c0 / 64 * BM * 64);
        if (wg == 0 || t + 1 < tiles) ember_bar_arrive(2 - wg, 256);
        ember_wgmma_wait<0>();
        if (lane == 0) ember_mbar_arrive(&empty[st]);
      }
    }
  }
  ember_flash_rows_out<DC, BF16>(out + (size_t)nb * S * 2 * D + c0, dk, r_lo, S, 2 * D, cs);
  ember_flash_rows_out<DC, BF16>(out + (size_t)nb * S * 2 * D + D + c0, dv, r_lo, S, 2 * D, 1.f);
}
