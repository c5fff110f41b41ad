"""What compute-sanitizer racecheck sees of an mbarrier-synchronised bulk-copy pipeline (issue 14).

kda_recurrence's pipeline in miniature: one producer lane fills a STAGES-deep ring of shared
memory with asynchronous bulk copies that complete on a `full` mbarrier (arrive.expect_tx, then
the copy); CONSUMERS warps wait on `full`, read the stage with ordinary shared loads, and hand
it back through an `empty` mbarrier (__syncwarp, then lane 0 arrives). Every variant but the
two `*_early` ones is correct (the script checks the sums); racecheck's verdict on each shows
which synchronisation it can see. The `*_early` variants are planted races (the stage is handed
back before it is read), as a control that racecheck does catch a real one here.

    PYTHONPATH=. compute-sanitizer --tool racecheck python examples/racecheck_mbarrier_pipeline.py [VARIANT ...]

What racecheck (compute-sanitizer 2025.3.1, H200, NVRTC 13.0) said, all in one process:
    bulk, bulk_last, bulk_mask  "Race reported between Write access at <v>+<UBLKCP of the refill loop>
                                 and Read access at <v>+<LDS of the consumers> [6944 hazards]" each:
                                 6944 = 28 refills x 62 lanes x 4 bytes, i.e. every consumer lane but
                                 the two lane 0s that arrive (the SASS has WARPSYNC.ALL, resp.
                                 VOTE.ANY + WARPSYNC, right before lane 0's SYNCS.ARRIVE)
    generic                     flagged alike (st.shared writes): not about the async proxy
    bulk_fill, bulk_all, tensor clean; bulk_early and generic_early flagged (bulk_early's sums wrong)
So racecheck sees the full barrier (complete_tx, then try_wait) and an arrive -> wait edge for
the arriving thread, but not __syncwarp() chained into lane 0's arrive: a false positive on
correct code, as in kda_recurrence (issue 14; see the comment at its empty_bar arrive).

VARIANT (default: all, in one process; kernels are named after their variant):
    bulk          cp.async.bulk (no tensor map), arrive.expect_tx before the copy: kda_recurrence's record copy
    bulk_fill     the same, no stage reused (rounds = STAGES): only the full-barrier hand-off
    bulk_last     cp.async.bulk, expect_tx; copy; arrive (the producer's arrival after its copy)
    bulk_all      cp.async.bulk; every consumer thread arrives on `empty` (no __syncwarp hand-off)
    bulk_mask     as bulk, with __syncwarp(__activemask()) (a mask the compiler cannot fold)
    tensor        cp.async.bulk.tensor (TMA, tensor map), arrive.expect_tx before the copy: the v tile
    generic       the producer lane stores the stage with st.shared, then arrives (no async proxy)
    bulk_early    PLANTED RACE: lane 0 hands the stage back before the warp reads it (cp.async.bulk)
    generic_early PLANTED RACE: the same with st.shared
"""
from __future__ import annotations

import sys

import numpy as np

STAGES, CONSUMERS, FLOATS, ROUNDS = 2, 2, 512, 16

SOURCE = r"""
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
struct __align__(64) TensorMap { uint64_t opaque[16]; };
#define DEV __device__ __forceinline__
constexpr int STAGES = %(STAGES)d, CONSUMERS = %(CONSUMERS)d, FLOATS = %(FLOATS)d, BYTES = FLOATS * 4;

DEV uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
DEV void mbar_init(uint64_t* b, uint32_t n) { asm volatile("mbarrier.init.shared::cta.b64 [%%0], %%1;" ::"r"(sa(b)), "r"(n)); }
DEV void arrive_expect_tx(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;" ::"r"(sa(b)), "r"(n) : "memory");
}
DEV void expect_tx(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%%0], %%1;" ::"r"(sa(b)), "r"(n) : "memory");
}
DEV void arrive(uint64_t* b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%%0];" ::"r"(sa(b)) : "memory"); }
DEV void wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\nW_%%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%%0], %%1;\n@!done bra W_%%=;\n}\n"
               ::"r"(sa(b)), "r"(parity) : "memory");
}
DEV void bulk(void* dst, const void* src, uint32_t n, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1], %%2, [%%3];"
               ::"r"(sa(dst)), "l"(src), "r"(n), "r"(sa(b)) : "memory");
}
DEV void tma_2d(void* dst, const TensorMap* map, uint64_t* b, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1, {%%3, %%4}], [%%2];"
               ::"r"(sa(dst)), "l"(map), "r"(sa(b)), "r"(c0), "r"(c1) : "memory");
}

// COPY: 0 cp.async.bulk, 1 cp.async.bulk.tensor, 2 st.shared by the producer lane
// LAST: the producer arrives on `full` after issuing its copy (expect_tx first) instead of before it
// RELEASE: 0 __syncwarp + lane 0 arrives, 1 every consumer thread arrives, 2 lane 0 arrives BEFORE the reads (race),
//          3 __syncwarp(__activemask()) + lane 0 arrives
template <int COPY, bool LAST, int RELEASE>
DEV void pipeline(const TensorMap* map, const float* src, float* out, int rounds) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - sa(smem_raw) %% 1024) %% 1024);
  __shared__ uint64_t full[STAGES], empty[STAGES];
  const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], RELEASE == 1 ? 32 * CONSUMERS : CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == CONSUMERS) {   // producer
    if (lane == 0) {
      for (int i = 0; i < rounds; ++i) {
        const int s = i %% STAGES;
        if (i >= STAGES) wait(&empty[s], ((i / STAGES) - 1) & 1);
        float* dst = reinterpret_cast<float*>(smem + s * BYTES);
        if (COPY == 2) {
          for (int j = 0; j < FLOATS; ++j) dst[j] = src[(long long)i * FLOATS + j];
          arrive(&full[s]);
        } else {
          if (LAST) expect_tx(&full[s], BYTES);
          else arrive_expect_tx(&full[s], BYTES);
          if (COPY == 0) bulk(dst, src + (long long)i * FLOATS, BYTES, &full[s]);
          else tma_2d(dst, map, &full[s], 0, 4 * i);
          if (LAST) arrive(&full[s]);
        }
      }
    }
    return;
  }
  float acc = 0.f;   // consumers
  for (int i = 0; i < rounds; ++i) {
    const int s = i %% STAGES;
    wait(&full[s], (i / STAGES) & 1);
    if (RELEASE == 2 && lane == 0) arrive(&empty[s]);
    const float* stage = reinterpret_cast<const float*>(smem + s * BYTES);
    for (int j = threadIdx.x; j < FLOATS; j += 32 * CONSUMERS) acc += stage[j];
    if (RELEASE == 1) {
      arrive(&empty[s]);
    } else if (RELEASE == 0 || RELEASE == 3) {
      if (RELEASE == 0) __syncwarp();
      else __syncwarp(__activemask());
      if (lane == 0) arrive(&empty[s]);
    }
  }
  out[blockIdx.x * 32 * CONSUMERS + threadIdx.x] = acc;
}

#define VARIANT(name, copy, last, release)                                                                   \
  extern "C" __global__ void __launch_bounds__(32 * (CONSUMERS + 1))                                         \
  name(const __grid_constant__ TensorMap map, const float* src, float* out, int rounds) {                    \
    pipeline<copy, last, release>(&map, src, out, rounds);                                                   \
  }
VARIANT(bulk, 0, false, 0)
VARIANT(bulk_fill, 0, false, 0)
VARIANT(bulk_last, 0, true, 0)
VARIANT(bulk_all, 0, false, 1)
VARIANT(bulk_mask, 0, false, 3)
VARIANT(tensor, 1, false, 0)
VARIANT(generic, 2, false, 0)
VARIANT(bulk_early, 0, false, 2)
VARIANT(generic_early, 2, false, 2)
""" % dict(STAGES=STAGES, CONSUMERS=CONSUMERS, FLOATS=FLOATS)

VARIANTS = ("bulk", "bulk_fill", "bulk_last", "bulk_all", "bulk_mask", "tensor", "generic", "bulk_early", "generic_early")
BLOCKS = 2


def run(names) -> bool:
    import cupy
    from pykda import runtime
    from pykda.runtime.launch import load_module

    module = load_module(runtime.compile_cubin(SOURCE, "sm_90a", "racecheck_mbarrier_pipeline.cu"), 0)
    ok = True
    for name in names:
        rounds = STAGES if name == "bulk_fill" else ROUNDS
        host = (np.arange(rounds * FLOATS) % 97).astype(np.float32)
        src = cupy.asarray(host)
        out = cupy.zeros(BLOCKS * 32 * CONSUMERS, dtype=cupy.float32)
        tmap = runtime.encode_tiled("src", "float32", src.data.ptr, (128, 4 * rounds), (512,), (128, 4))
        smem = STAGES * FLOATS * 4 + 1024
        module.kernel(name).launch((BLOCKS, 1, 1), (32 * (CONSUMERS + 1), 1, 1),
                                   (tmap, src.data.ptr, out.data.ptr, np.int32(rounds)), smem,
                                   cupy.cuda.get_current_stream().ptr)
        got = cupy.asnumpy(out).reshape(BLOCKS, 32 * CONSUMERS)
        want = host.reshape(rounds, FLOATS // (32 * CONSUMERS), 32 * CONSUMERS).sum(axis=(0, 1))
        good = bool(np.array_equal(got, np.broadcast_to(want, got.shape)))
        ok &= good or name.endswith("_early")
        print(f"{name:14s} rounds={rounds:2d} sums {'right' if good else 'WRONG'}", flush=True)
    return ok


if __name__ == "__main__":
    chosen = sys.argv[1:] or list(VARIANTS)
    unknown = [n for n in chosen if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    sys.exit(0 if run(chosen) else 1)
