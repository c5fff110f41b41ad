// PTX wrappers for Hopper's asynchronous copies: mbarriers, bulk tensor copies (TMA), fences.
#pragma once
#include "common.cuh"

PYKDA_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----
PYKDA_DEVICE void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
// Make mbarrier.init visible to the async proxy (the TMA unit) before first use.
PYKDA_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrive once and announce `bytes` of transaction to come (the producer's arrival).
PYKDA_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
PYKDA_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Block until the phase with parity `phase` has completed.
PYKDA_DEVICE void mbar_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}
// A ring producer's wait before its i-th fill (into stage i % STAGES): the consumers have released
// that stage's previous fill, the phase of round i / STAGES - 1 (the first round has none).
template <int STAGES>
PYKDA_DEVICE void wait_stage_free(uint64_t* empty_bar, int i) {
  if (i >= STAGES) mbar_wait(&empty_bar[i % STAGES], ((i / STAGES) - 1) & 1);
}

// ---- bulk tensor copies global -> shared, completing on an mbarrier ----
PYKDA_DEVICE void tma_prefetch_desc(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
PYKDA_DEVICE void tma_load_2d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}
PYKDA_DEVICE void tma_load_3d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
PYKDA_DEVICE void tma_load_4d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
PYKDA_DEVICE void tma_load_5d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                             int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}

// ---- cp.async: per-thread asynchronous global -> shared copies, completing on an mbarrier ----
PYKDA_DEVICE void cp_async_16(void* dst, const void* src) {   // both 16-byte aligned
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(src))
               : "memory");
}
// The 16 bytes at src, or (valid false) 16 zero bytes without a read.
PYKDA_DEVICE void cp_async_16_zfill(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(valid ? 16 : 0)
               : "memory");
}
PYKDA_DEVICE void cp_async_4(void* dst, const void* src) {    // both 4-byte aligned
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(src))
               : "memory");
}
// Arrive on `bar` once this thread's earlier cp.async copies have landed (counted in the
// barrier's expected arrivals).
PYKDA_DEVICE void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Wait until this thread's cp.async copies have landed.
PYKDA_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Shared memory written by ordinary stores and read next by the async proxy needs this fence.
PYKDA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Four floats into shared memory (16-byte aligned) as one 128-bit store, whichever registers hold them:
// ptxas splits a float4 store whose values do not sit in one aligned register quad into four 32-bit
// stores, each a wavefront where lanes' addresses are 16-byte pieces apart.
PYKDA_DEVICE void st_shared_v4(float* p, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(p)), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// Named barrier over `count` threads (a multiple of 32), id 1..15 (0 is __syncthreads).
PYKDA_DEVICE void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Contiguous global -> shared bulk copy (no tensor map), completing on an mbarrier.
// dst, src 16-byte aligned; bytes a multiple of 16.
PYKDA_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// ---- thread block clusters: the cluster barrier and reads of a peer CTA's shared memory ----
// Every non-exited thread of the cluster arrives, then waits: shared-memory writes before the
// barrier are visible to the whole cluster after it (release / acquire).
PYKDA_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// The address of this CTA's shared variable at `addr` (shared::cta) in cluster CTA `rank` (shared::cluster).
PYKDA_DEVICE uint32_t cluster_peer_addr(uint32_t addr, uint32_t rank) {
  uint32_t peer;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer) : "r"(addr), "r"(rank));
  return peer;
}
PYKDA_DEVICE float ld_cluster_f32(uint32_t addr) {
  float x;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(x) : "r"(addr) : "memory");
  return x;
}
PYKDA_DEVICE float4 ld_cluster_v4(uint32_t addr) {   // 16-byte aligned
  float4 x;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "r"(addr) : "memory");
  return x;
}
