
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#define EMBER_D __device__ static inline
#define ember_as_float __uint_as_float
#define ember_as_uint __float_as_uint
/* the hardware's conversion (round to nearest even, subnormals and overflow as IEEE says); NaN
   kept as the C backend writes it, sign and quiet bit. The branchy software version made the
   epilogue of an f16 matmul cost half its time. */
EMBER_D unsigned short ember_f32_to_f16_bits(float f) {
  if (f != f) return (unsigned short)(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7e00u);
  unsigned r;   /* the paired form: one F2FP (see ember_round_bf16_op) */
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(0.f), "f"(f));
  return (unsigned short)r;
}
/* 2^x as the hardware's approximation alone (MUFU.EX2, 2 ulp): exp2f adds a test and two
   multiplies for subnormal results, a third of a softmax's instructions. For results rounded to
   f16 or bf16 (and flash attention's weights): a result below 2^-126 becomes 0. */
EMBER_D float ember_ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
/* a / b for a result rounded to f16 or bf16: (a s) times the hardware's 1 / (b s) (MUFU.RCP,
   1 ulp; the quotient within 2 ulp of f32, far below half a 16-bit ulp), where the IEEE
   division took 9 instructions an element. Branch-free, so the reciprocal of a row's sum is
   computed once. s = 1 unless 1 / b would leave the normal range: 2^-4 for |b| >= 2^126,
   2^24 for a subnormal b. 0, inf and NaN come out as the division's. */
EMBER_D float ember_rcp(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}
EMBER_D float ember_div16(float a, float b) {
  const float s = fabsf(b) >= 0x1p126f ? 0x1p-4f : fabsf(b) < 0x1p-126f ? 0x1p24f : 1.f;
  return (a * s) * ember_rcp(b * s);
}
