
EMBER_D float ember_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return ember_as_float(sign | 0x7f800000u | (m << 13));
  if (e) return ember_as_float(sign | ((e + 112u) << 23) | (m << 13));
  float f = (float)m * 5.9604644775390625e-8f; return sign ? -f : f;
}
EMBER_D float ember_bf16_to_f32(unsigned short h) { return ember_as_float((unsigned int)h << 16); }
EMBER_D unsigned short ember_f32_to_bf16_bits(float f) {  /* round to nearest, ties to even */
  unsigned int x = ember_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
#ifdef __CUDA_ARCH__  /* one instruction from sm_80 on, the paired form (cuda.py's ember_round_bf16_op) */
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(0.f), "f"(f));
  return (unsigned short)r;
#else
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
}
/* double -> float rounding to odd, so that a second rounding to f16/bf16 is correct */
EMBER_D float ember_f32_odd(double d) {
  float f = (float)d;
  if ((double)f != d && f == f && fabsf(f) != INFINITY) {
    unsigned int b = ember_as_uint(f);
    if (fabs((double)f) > fabs(d)) b -= 1u;
    f = ember_as_float(b | 1u);
  }
  return f;
}
EMBER_D float ember_round_f16(double d) { return ember_f16_to_f32(ember_f32_to_f16_bits(ember_f32_odd(d))); }
EMBER_D float ember_round_bf16(double d) { return ember_bf16_to_f32(ember_f32_to_bf16_bits(ember_f32_odd(d))); }
EMBER_D float ember_round_f16f(float f) { return ember_f16_to_f32(ember_f32_to_f16_bits(f)); }
EMBER_D float ember_round_bf16f(float f) { return ember_bf16_to_f32(ember_f32_to_bf16_bits(f)); }
/* max that is NaN when either operand is (fmaxf is not); on the GPU one instruction (sm_80 on)
   where the compare-select took three */
EMBER_D float ember_max_float(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return ((a != a) | (a > b)) ? a : b;
#endif
}
EMBER_D double ember_max_double(double a, double b) { return ((a != a) | (a > b)) ? a : b; }
