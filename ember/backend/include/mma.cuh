
EMBER_D unsigned ember_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
EMBER_D void ember_cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(ember_smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
EMBER_D void ember_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> EMBER_D void ember_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
EMBER_D void ember_ldmatrix4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ember_smem_addr(p)));
}
EMBER_D void ember_ldmatrix4_trans(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ember_smem_addr(p)));
}
#define EMBER_MMA(TYPE) \
EMBER_D void ember_mma_##TYPE(float* c, const unsigned* a, const unsigned* b) { \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #TYPE "." #TYPE ".f32 " \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); \
}
EMBER_MMA(bf16)
EMBER_MMA(f16)
