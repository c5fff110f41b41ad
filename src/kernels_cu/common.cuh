// Base types and numeric helpers shared by every pykda kernel.
// Self-contained: NVRTC compiles it with no CUDA toolkit header.
#pragma once

#ifdef __CUDACC_RTC__   // NVRTC: no system headers
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
#else                   // nvcc, for register/spill reports of a rendered kernel
#include <stdint.h>
#endif

#define PYKDA_DEVICE __device__ __forceinline__
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// 16-bit storage types: the bit pattern is all the kernels keep; arithmetic is fp32.
struct bf16_t { uint16_t bits; };
struct fp16_t { uint16_t bits; };

// A tensor map encoded on the host (CUtensorMap: 128 bytes, 64-byte aligned),
// passed by value as a __grid_constant__ kernel parameter.
struct __align__(64) TensorMap { uint64_t opaque[16]; };

// Dynamic shared memory rounded up to 1024 bytes (what 128-byte-swizzled TMA tiles need);
// callers request 1024 bytes more than they use.
PYKDA_DEVICE uint8_t* align_smem_1024(uint8_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return p + (((a + 1023u) & ~1023u) - a);
}

// ---- conversions: 16-bit floats <-> fp32 ----
PYKDA_DEVICE float to_float(bf16_t x) { return __uint_as_float(uint32_t(x.bits) << 16); }
PYKDA_DEVICE float to_float(float x) { return x; }
PYKDA_DEVICE float to_float(fp16_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
template <typename T> PYKDA_DEVICE T from_float(float f);
template <> PYKDA_DEVICE bf16_t from_float<bf16_t>(float f) {
  bf16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}
template <> PYKDA_DEVICE fp16_t from_float<fp16_t>(float f) {
  fp16_t r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}

// Two fp32 -> one packed 32-bit register (lo in the low half), as mma.sync operands want.
template <typename T> PYKDA_DEVICE uint32_t pack2(float lo, float hi);
template <> PYKDA_DEVICE uint32_t pack2<bf16_t>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> PYKDA_DEVICE uint32_t pack2<fp16_t>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// One packed register -> two fp32 (lo, hi).
PYKDA_DEVICE float2 unpack2(uint32_t v, bf16_t) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
PYKDA_DEVICE float2 unpack2(uint32_t v, fp16_t) {
  float lo, hi;
  asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
      : "=f"(lo), "=f"(hi) : "r"(v));
  return make_float2(lo, hi);
}

// Eight consecutive elements (16-byte aligned) as loaded: one or two 16-byte words, converted
// to fp32 at use (unpack8), so a kernel can issue all its loads before the first conversion.
template <typename T> struct Raw8 { uint4 w; };   // 2-byte elements: bf16_t, fp16_t
template <> struct Raw8<float> { float4 a, b; };
template <typename T> PYKDA_DEVICE Raw8<T> load_raw8(const T* p) { return {*reinterpret_cast<const uint4*>(p)}; }
PYKDA_DEVICE Raw8<float> load_raw8(const float* p) {
  return {*reinterpret_cast<const float4*>(p), *reinterpret_cast<const float4*>(p + 4)};
}
template <typename T> PYKDA_DEVICE void unpack8(const Raw8<T>& r, float (&x)[8]) {
  const uint32_t w[4] = {r.w.x, r.w.y, r.w.z, r.w.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = unpack2(w[j], T{});
    x[2 * j] = f.x;
    x[2 * j + 1] = f.y;
  }
}
PYKDA_DEVICE void unpack8(const Raw8<float>& r, float (&x)[8]) {
  x[0] = r.a.x; x[1] = r.a.y; x[2] = r.a.z; x[3] = r.a.w;
  x[4] = r.b.x; x[5] = r.b.y; x[6] = r.b.z; x[7] = r.b.w;
}
// Eight consecutive elements (16-byte aligned) as fp32, from bf16, fp16 or fp32 storage.
template <typename T> PYKDA_DEVICE void load8(const T* p, float (&x)[8]) { unpack8(load_raw8(p), x); }
// Eight fp32 to 16-byte aligned shared or global memory.
PYKDA_DEVICE void store8(float* p, const float (&x)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(x[4], x[5], x[6], x[7]);
}

// ---- fast math ----
PYKDA_DEVICE float fast_exp2(float x) {  // 2^x, ex2.approx (2 ulp); -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
PYKDA_DEVICE float fast_rsqrt(float x) {  // 1/sqrt(x), rsqrt.approx; x below 2^-126 flushed to 0 (-> inf)
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
PYKDA_DEVICE float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
PYKDA_DEVICE float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- warp reductions over groups of WIDTH lanes, STRIDE apart (adjacent by default) ----
template <int WIDTH, int STRIDE = 1> PYKDA_DEVICE float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o * STRIDE);
  return v;
}
// N independent sums at once: one butterfly, its shuffles interleaved.
template <int WIDTH, int N> PYKDA_DEVICE void group_sums(float (&v)[N]) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}
__host__ __device__ constexpr int ilog2(int n) { return n > 1 ? 1 + ilog2(n / 2) : 0; }   // of a power of two

// N sums at once (N a power of two <= WIDTH), each left in only some lanes: a reduce-scatter.
// Each butterfly step halves the values a lane carries (it keeps one half, its partner the
// other, and each adds what the other sends), so N - 1 shuffles do the work of N · log2(WIDTH).
// Returns the sum of value index (lane % WIDTH) / (WIDTH / N), which WIDTH / N lanes hold.
template <int WIDTH, int N> PYKDA_DEVICE float group_scatter_sums(float (&v)[N], int lane) {
  static_assert((N & (N - 1)) == 0 && N <= WIDTH, "N: a power of two <= WIDTH");
  constexpr int HALVINGS = ilog2(N), STEPS = ilog2(WIDTH);
#pragma unroll
  for (int step = 0; step < HALVINGS; ++step) {   // counted loops: unrolled, so v stays in registers
    const int o = WIDTH / 2 >> step, half = N / 2 >> step;
    const uint32_t upper = lane & o ? ~0u : 0u;   // all ones: this lane keeps the upper half
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {   // bitwise selects: a select of array elements would go to local memory
      if (i >= half) break;
      const uint32_t lo = __float_as_uint(v[i]), hi = __float_as_uint(v[i + half]);
      const float keep = __uint_as_float((hi & upper) | (lo & ~upper));
      const float send = __uint_as_float((lo & upper) | (hi & ~upper));
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int step = HALVINGS; step < STEPS; ++step) v[0] += __shfl_xor_sync(0xffffffffu, v[0], WIDTH / 2 >> step);
  return v[0];
}
template <int WIDTH, int STRIDE = 1> PYKDA_DEVICE float group_max(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o * STRIDE));
  return v;
}
