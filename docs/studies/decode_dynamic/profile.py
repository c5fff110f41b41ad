"""Where the dynamic walk's time goes: event time and the profiler's per-kernel device time (memset
included), chunks vs dynamic, on the padded batches of many short units."""
import numpy as np
import torch
import pykda
from pykda.bench.timing import Timer
from pykda.bench.decode import uneven_lengths
from pykda.ops import decode

timer = Timer()


def mode(dyn):
    decode.dynamic_pays = (lambda *a: True) if dyn else (lambda *a: False)
    decode.plan_decode.cache_clear()
    decode.PREPARED.clear()


for B, hq, hkv, d, S in ((256, 8, 1, 128, 4096), (64, 128, 8, 128, 2048), (256, 64, 8, 128, 513),
                         (128, 32, 4, 256, 1024), (64, 32, 8, 128, 8192), (1024, 32, 8, 128, 300)):
    lens = uneven_lengths(B, S, seed=S + B)
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda()
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    f = lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kl)
    res = {}
    for rep in range(2):
        for dyn in (False, True):
            mode(dyn)
            f()
            t = timer.median_us(f, repeats=30)
            res.setdefault(dyn, []).append(t)
    line = []
    for dyn in (False, True):
        mode(dyn)
        for _ in range(10):
            f()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        ks = {e.key[:20]: e.device_time_total / e.count for e in prof.key_averages() if e.device_time_total > 0}
        line.append(f"{'dyn' if dyn else 'chk'} ev {min(res[dyn]):6.1f} " + " ".join(f"{k}={v:.1f}" for k, v in ks.items()))
    print(f"{B}x{hq}/{hkv} {S}~ D{d}: " + " | ".join(line), flush=True)
    del k, v
    torch.cuda.empty_cache()
