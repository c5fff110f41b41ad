"""Per-warp phase stamps (globaltimer and clock64 at each phase's end) of kda_decode_mma as of
c383b49, B 8 / 64, H 32, K 128, T 4, softplus gate, cold L2. On a checkout of c383b49 with
stamps.patch applied (`git apply docs/studies/kda_decode_chunked/stamps.patch`), on the GPU:
    PYTHONPATH=. python docs/studies/kda_decode_chunked/stamps.py"""
import numpy as np, cupy, torch
from pykda.bench import kda_decode as kd0, timing
from pykda.runtime import cache

timer, _ = timing.start("read")
NAMES = ["entry", "loads issued", "sums 1 (q/k/g in)", "sums 2", "state in", "W|Q", "u, o", "update", "stored", "", "", "sm"]
for B in (8, 64):
    x, pool, idx = kd0._inputs(B, 32, "bfloat16", "softplus", 4)
    rows = idx[:, 0].contiguous()
    for _ in range(3):
        kd0.ours_step(x, pool, rows, "softplus")
    mod = next(m for (spec, dev), m in cache._modules.items() if "mma" in str(spec))
    ptr = mod.module.get_global_var("pykda_stamps"); ptr = getattr(ptr, "ptr", ptr)
    nbytes = 4096 * 8 * 12 * 2 * 8
    cupy.cuda.runtime.memset(ptr, 0, nbytes)
    timer.median_us(lambda: kd0.ours_step(x, pool, rows, "softplus"), warmup=0, repeats=1)
    torch.cuda.synchronize()
    h = np.empty(4096 * 8 * 12 * 2, np.uint64)
    cupy.cuda.runtime.memcpy(h.ctypes.data, ptr, nbytes, 2)
    ctas = B * 32
    s = h.reshape(4096, 8, 12, 2)[:ctas].astype(np.int64)
    g, c = s[..., 0], s[..., 1]
    t0 = g[:, :, 0].min(1)
    base = t0.min()
    print(f"B={B}: {ctas} CTAs; span {(g[:, :, 8].max() - base) / 1e3:.2f} us; clock {np.median((c[:, 0, 8] - c[:, 0, 0]) / np.maximum(1, g[:, 0, 8] - g[:, 0, 0])):.3f} GHz")
    print("  CTA start (us from first): pcts 0/25/50/75/100:", np.percentile((t0 - base) / 1e3, [0, 25, 50, 75, 100]).round(2))
    print("  CTA life (us): pcts 0/25/50/75/100:", np.percentile((g[:, :, 8].max(1) - t0) / 1e3, [0, 25, 50, 75, 100]).round(2))
    for i in range(1, 9):
        last = (g[:, :, i].max(1) - t0) / 1e3
        cyc = (c[:, 0, i] - c[:, 0, i - 1])
        print(f"  {i} {NAMES[i]:18s} all warps done at (us) median {np.median(last):6.2f} p90 {np.percentile(last, 90):6.2f} | warp0 step cycles median {np.median(cyc):8.0f}")
    sm = s[:, 0, 11, 0]
    per_sm = np.bincount(sm, minlength=132)
    print("  CTAs per SM: min/max", per_sm.min(), per_sm.max())
