// Tensor-core fragments: ldmatrix and mma.sync m16n8k16 with fp32 accumulators,
// plus the 128-byte swizzle that TMA applies to 64-element (128-byte) rows.
#pragma once
#include "common.cuh"
#include "ptx.cuh"

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a tile of 128-byte rows
// written by TMA with CU_TENSOR_MAP_SWIZZLE_128B (tile base 1024-byte aligned).
PYKDA_DEVICE uint32_t swizzle128(int row, int chunk) {
  return uint32_t(row * 128 + ((chunk ^ (row & 7)) << 4));
}

PYKDA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
PYKDA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
PYKDA_DEVICE void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
PYKDA_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Four 8x8 16-bit matrices from registers into shared memory, transposed: thread l's register i
// holds elements (l / 4, 2(l % 4)..+1) of matrix i, stored at rows 2(l % 4)..+1, column l / 4 of
// the matrix whose 8 row addresses lanes 8i..8i+7 give.
PYKDA_DEVICE void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// An 8x8 16-bit matrix transposed across the warp: lane l's register holds elements (l / 4,
// 2(l % 4)..+1) of the matrix, and gets the same elements of its transpose.
PYKDA_DEVICE uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// What the bf16x2 rounding hi of two fp32 values left, as bf16x2: x ≈ hi + lo to ~16 bits.
PYKDA_DEVICE uint32_t bf16x2_rest(float x, float y, uint32_t hi) {
  const float2 h = unpack2(hi, bf16_t{});
  return pack2<bf16_t>(x - h.x, y - h.y);
}

// Split two fp32 values into bf16x2 hi and lo parts: x ≈ hi + lo to ~16 bits.
PYKDA_DEVICE void split_bf16x2(float x, float y, uint32_t& hi, uint32_t& lo) {
  hi = pack2<bf16_t>(x, y);
  lo = bf16x2_rest(x, y, hi);
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulate. A: 4 regs, B: 2 regs, D: 4 floats.
// Fragment layout (lane = 4*g + t): A a0:(g, 2t..2t+1) a1:(g+8, ..) a2:(g, 2t+8..) a3:(g+8, 2t+8..);
// B b0:(k=2t..2t+1, n=g) b1:(k=2t+8.., n=g); D d0,d1:(g, 2t..2t+1) d2,d3:(g+8, 2t..2t+1).
PYKDA_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bf16_t) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// The same with k = 8: A a0:(g, 2t..2t+1) a1:(g+8, ..); B b0:(k=2t..2t+1, n=g).
PYKDA_DEVICE void mma_1688(float (&d)[4], const uint32_t (&a)[2], uint32_t b, bf16_t) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}
PYKDA_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], fp16_t) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
