
/* An op's result to bf16 and back, without the NaN test a cast needs: the GPU's arithmetic makes
   only the canonical NaN, which cvt keeps (0x7fff). The paired conversion puts f, rounded, in
   the upper half and 0 in the lower: the rounded value's f32 bits in one F2FP instruction. The
   single conversion (F2F) is a slow instruction on Hopper, and bf16 softmax was bound by them. */
EMBER_D float ember_round_bf16_op(float f) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f), "f"(0.f));
  return __uint_as_float(r);
}
/* an op's result as bf16 bits: the conversion of ember_round_bf16_op, in the lower half */
EMBER_D unsigned short ember_bf16_bits_op(float f) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(0.f), "f"(f));
  return (unsigned short)r;
}
/* bf16 a * b + c, rounded once, for operands that hold bf16 values (their upper halves are
   them): the hardware's bf16 fma at full rate, where rounding an f32 result is one of Hopper's
   slow conversions. add is fma(a, 1, b), sub fma(b, -1, a), mul fma(a, b, -0): each rounded
   once, as the spec says (an f32 sub rounded to bf16 rounds twice). No subnormal is flushed. */
EMBER_D float ember_bf16_fma(float a, float b, float c) {
  unsigned short r;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"((unsigned short)(__float_as_uint(a) >> 16)),
      "h"((unsigned short)(__float_as_uint(b) >> 16)), "h"((unsigned short)(__float_as_uint(c) >> 16)));
  return __uint_as_float((unsigned)r << 16);
}
/* block-wide reductions: every thread of the block gets the result */
EMBER_D float ember_add(float a, float b) { return a + b; }
EMBER_D double ember_add(double a, double b) { return a + b; }
template <typename T> EMBER_D T ember_add(T a, T b) { return (T)((unsigned long long)a + (unsigned long long)b); }
EMBER_D float ember_max2(float a, float b) { return ember_max_float(a, b); }
EMBER_D double ember_max2(double a, double b) { return ember_max_double(a, b); }
/* Integer max without a compare-select. ptxas of CUDA 13.0 (sm_90, -O1 and above) merges chains
   of integer max into the 3-input VIMNMX3 and drops the negation of an operand: max(a, -b, c)
   comes out as max(a, b, c) (issue 14; tests/tools/ptxas_probe.py shows it). No VIMNMX3 is
   formed from this form; integer max is rare in these kernels, so its few extra instructions
   cost nothing measurable. */
template <typename T> EMBER_D T ember_imax(T a, T b) { return (T)(a ^ ((a ^ b) & -(T)(a < b))); }
template <typename T> EMBER_D T ember_max2(T a, T b) { return ember_imax(a, b); }
EMBER_D float ember_shfl(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
EMBER_D double ember_shfl(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
template <typename T> EMBER_D T ember_shfl(T v, int o) { return (T)__shfl_xor_sync(0xffffffffu, (long long)v, o); }
/* the reduction of G consecutive lanes of a warp (G threads per row): each of them gets the result */
template <typename T, int MAX, int G> EMBER_D T ember_group_reduce(T v) {
  for (int o = G / 2; o > 0; o >>= 1) { T w = ember_shfl(v, o); v = MAX ? ember_max2(v, w) : ember_add(v, w); }
  return v;
}
template <typename T, int MAX> EMBER_D T ember_block_reduce(T v) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) { T w = ember_shfl(v, o); v = MAX ? ember_max2(v, w) : ember_add(v, w); }
  __syncthreads();  /* part[] may still be read by the previous reduction */
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = part[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) v = MAX ? ember_max2(v, part[w]) : ember_add(v, part[w]);
  return v;
}
