
/* a wgmma shared-memory matrix descriptor: 128-byte swizzle, byte offsets in 16-byte units */
EMBER_D unsigned long long ember_desc(const void* p, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((ember_smem_addr(p) & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}
EMBER_D void ember_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
EMBER_D void ember_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> EMBER_D void ember_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
EMBER_D void ember_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* mbarriers: the pipeline's "slot s is full" (its TMA copies' bytes arrived) and "slot s is free" */
EMBER_D void ember_mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(ember_smem_addr(bar)), "r"(count));
}
EMBER_D void ember_mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(ember_smem_addr(bar)), "r"(parity) : "memory");
}
EMBER_D void ember_mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(ember_smem_addr(bar)) : "memory");
}
/* the producer's arrival, telling the barrier how many bytes the slot's TMA copies bring */
EMBER_D void ember_mbar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(ember_smem_addr(bar)), "r"(bytes) : "memory");
}
/* a CUtensorMap, passed by value (__grid_constant__) */
struct __align__(64) EmberTmap { unsigned long long v[16]; };
/* the TMA store's bulk groups, and a barrier of one warpgroup's threads (ids from 1: 0 is __syncthreads') */
EMBER_D void ember_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
EMBER_D void ember_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
EMBER_D void ember_bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
EMBER_D void ember_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
/* arrive at named barrier id without waiting (a producer's, or the other warpgroup's turn) */
EMBER_D void ember_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
/* warpgroups trade registers: the producer needs few, the accumulators many */
template <int N> EMBER_D void ember_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
}
template <int N> EMBER_D void ember_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
}
