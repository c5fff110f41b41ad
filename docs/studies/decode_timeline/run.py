"""Per-CTA clock64 stamps of decode_partial on launch-bound shapes (stamps.patch applied).

On the GPU machine, in a copy of the tree: `git apply docs/studies/decode_timeline/stamps.patch`,
then `PYTHONPATH=. PYKDA_CACHE_DIR=/tmp/sc python docs/studies/decode_timeline/run.py` (a fresh
cache dir: the patched kernels compile there). Thread 0 keeps its stamps in registers and writes
them at its end, so no stamp's store sits before the barrier-init fence it would be waiting on.
"""
import cupy
import numpy as np
import torch

import pykda
from pykda.bench import timing
from pykda.runtime import cache

SM_GHZ = 1.98   # clock64 to ns (globaltimer's span below shows the clock actually ran ~1.8 GHz)
NAMES = ["entry", "synced", "tma issued", "q ready", "tile0 landed", "loop done", "merged", "stored"]
SHAPES = (((32, 8, 17, 64), True), ((32, 8, 17, 64), False), ((32, 8, 64, 128), True), ((32, 32, 8192, 128), True))


def stamps_of_calls(call, flush, timer, calls=20):
    """The medians over `calls` calls of each CTA's stamps (rows of CTAs that wrote them)."""
    mod = [m for (spec, _), m in cache._modules.items() if spec.template == "decode"][-1]
    ptr = int(mod.module.get_global_var("pykda_stamps"))
    view = cupy.ndarray((64, 10), dtype=cupy.uint64,
                        memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, 64 * 10 * 8, None), 0))
    runs = []
    for _ in range(calls):
        cupy.cuda.runtime.memset(ptr, 0, 64 * 10 * 8)
        if flush:
            timer.flush()
        call()
        torch.cuda.synchronize()
        runs.append(view.get().astype(np.int64))
    st = np.median(np.stack(runs), axis=0)
    return st[st[:, 9] > 0]


def main():
    timer, _ = timing.start()
    for (hq, hkv, S, D), flush in SHAPES:
        q = torch.randn(hq, D, device="cuda").to(torch.bfloat16)
        k = torch.randn(S, hkv, D, device="cuda").to(torch.bfloat16)
        v = torch.randn_like(k)
        call = lambda: pykda.single_decode_with_kv_cache(q, k, v)  # noqa: E731
        us = timer.median_us(call)
        st = stamps_of_calls(call, flush, timer)
        ns = (st[:, :8] - st[:, :1]) / SM_GHZ
        print(f"{hq}/{hkv} S={S} D={D} {'cold' if flush else 'warm'} L2: {us:.2f} µs, {len(st)} CTAs; ns from a CTA's "
              f"entry (median over CTAs):")
        print("   " + "  ".join(f"{n} {np.median(ns[:, i]):.0f}" for i, n in enumerate(NAMES)))
        print(f"   globaltimer entry -> stored {np.median(st[:, 9] - st[:, 8]):.0f} ns")


if __name__ == "__main__":
    main()
