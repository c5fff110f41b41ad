// Warpgroup MMA (wgmma, sm_90a): D (fp32, registers) += A (fp16, registers) · B (fp16, shared
// memory through a matrix descriptor), for the 128 threads of a warpgroup (4 consecutive warps,
// the first a multiple of 4). Per warp, A and D fragments are laid out as mma.sync's m16n8k16
// ones (warp w of the group holding rows 16w..16w+15; D's n-tile j in d[4j..4j+3]), so the
// same registers serve both.
#pragma once
#include "common.cuh"

// A shared-memory matrix descriptor: start address, leading- and stride-dimension byte offsets
// (PTX ISA, "Matrix Descriptor Format"), swizzle 0 (none) or 1 (128-byte; its pattern starting at
// a 1024-byte boundary).
PYKDA_DEVICE uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo, uint32_t swizzle) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFF) >> 4) << 32 | uint64_t(swizzle) << 62;
}
// Registers written by ordinary instructions (A fragments, accumulators), then read by wgmma.
PYKDA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
PYKDA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Every committed group done: its accumulators readable, its shared memory free.
PYKDA_DEVICE void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Every committed group but the newest done.
PYKDA_DEVICE void wgmma_wait_all_but_last() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// Registers pinned where they stand: the compiler neither recomputes an A fragment into the
// registers of one still being read by an earlier wgmma (ptxas then serializes the wgmmas) nor
// moves accumulator reads across the wait.
template <int N> PYKDA_DEVICE void wgmma_pin(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N> PYKDA_DEVICE void wgmma_pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d[N/2] += a · B, m64 x nN x k16; TRANS_B: B is N-major in shared memory (else K-major). The
// shapes kda_recurrence takes (K 128, C 16): n16 and n32 K-major, n128 N-major.
// Other shapes: never run. (kda_recurrence is no template, so NVRTC instantiates the calls in the
// wgmma branch of its other shapes, whose `if constexpr` leaves them out of the kernel.)
template <int N, bool TRANS_B> PYKDA_DEVICE void wgmma_f16(float (&)[N / 2], const uint32_t (&)[4], uint64_t) { __trap(); }

template <> PYKDA_DEVICE void wgmma_f16<16, false>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %13, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <> PYKDA_DEVICE void wgmma_f16<32, false>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %21, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

template <> PYKDA_DEVICE void wgmma_f16<128, true>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n\t}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}
