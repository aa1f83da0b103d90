// The rates of the instructions a bf16 op's rounding can use, on this GPU, in results per clock
// per SM: the single conversion cvt.rn.bf16.f32 (F2F), the paired cvt.rn.bf16x2.f32 (F2FP) as
// ember_round_bf16_op uses it, the hardware's bf16 fma (with the shifts between f32 and bf16),
// MUFU.EX2 and FMUL. It decided backend/cuda.py's rounding (docs/performance.md, Known gaps).
//   nvcc -arch=sm_90a -o /tmp/conversion_rates bench/conversion_rates.cu && /tmp/conversion_rates
#include <cstdio>
#include <cuda_runtime.h>
constexpr int N = 8, ITERS = 4096, BLOCKS_PER_SM = 2, THREADS = 1024;
__device__ __forceinline__ float f2f(float x) {
  unsigned short h;
  asm volatile("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return __uint_as_float((unsigned)h << 16);
}
__device__ __forceinline__ float f2fp(float x) {
  unsigned r;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x), "f"(0.f));
  return __uint_as_float(r);
}
__device__ __forceinline__ float ex2(float x) {
  float r;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float bf16_sub(float a, float b) {
  unsigned short r, m1 = 0xBF80;
  asm volatile("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r)
               : "h"((unsigned short)(__float_as_uint(b) >> 16)), "h"(m1), "h"((unsigned short)(__float_as_uint(a) >> 16)));
  return __uint_as_float((unsigned)r << 16);
}
template <int K> __global__ void run(float* out, float a) {
  float x[N];
  for (int i = 0; i < N; i++) x[i] = a + threadIdx.x * 1e-3f + i;
  for (int it = 0; it < ITERS; it++) {
#pragma unroll
    for (int i = 0; i < N; i++) {   // N independent chains: the rate, not the latency
      if (K == 0) x[i] = f2f(x[i] * 1.0001f);
      if (K == 1) x[i] = f2fp(x[i] * 1.0001f);
      if (K == 2) x[i] = bf16_sub(x[i], 0.5f);
      if (K == 3) x[i] = ex2(x[i]) * 0.5f;
      if (K == 4) x[i] = x[i] * 1.0001f;
    }
  }
  float s = 0;
  for (int i = 0; i < N; i++) s += x[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
template <int K> double rate(float* out, int sms, double clock_hz) {
  int blocks = sms * BLOCKS_PER_SM;
  run<K><<<blocks, THREADS>>>(out, 1.f);   // warm-up
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  run<K><<<blocks, THREADS>>>(out, 1.f);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return (double)blocks * THREADS * ITERS * N / (ms * 1e-3) / clock_hz / sms;
}
int main() {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  float* out;
  cudaMalloc(&out, (size_t)p.multiProcessorCount * BLOCKS_PER_SM * THREADS * sizeof(float));
  double hz = clock_khz * 1e3;
  printf("%s, %d SMs, %.2f GHz; results per clock per SM (each with an FMUL, but the fma's)\n", p.name,
         p.multiProcessorCount, hz / 1e9);
  printf("cvt.rn.bf16.f32 (F2F)                    %6.1f\n", rate<0>(out, p.multiProcessorCount, hz));
  printf("cvt.rn.bf16x2.f32 with 0 (F2FP)          %6.1f\n", rate<1>(out, p.multiProcessorCount, hz));
  printf("fma.rn.bf16 sub, shifts to and from f32  %6.1f\n", rate<2>(out, p.multiProcessorCount, hz));
  printf("ex2.approx.ftz.f32 (MUFU.EX2)            %6.1f\n", rate<3>(out, p.multiProcessorCount, hz));
  printf("FMUL alone                               %6.1f\n", rate<4>(out, p.multiProcessorCount, hz));
  return 0;
}
