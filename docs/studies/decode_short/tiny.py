"""One sequence of a few rows (issue 13's worst grid row is 32/8 KV 17 D 64): pykda's padded single
and batched decode (TMA boxes) against its paged decode on pages of one row (the cp.async gather,
which reads the page table first) and FlashInfer's single decode on both of its paths, µs, cold L2,
median of 50, HND. Run after `source .peers/activate.sh`: `python tiny.py`."""
import functools

import torch

import pykda
from pykda.bench import timing

timer, _ = timing.start("read")
HQ, HKV = 32, 8
try:
    import flashinfer
except ImportError:
    flashinfer = None
print(f"{'D':>3} {'S':>4} {'single':>7} {'batch':>7} {'paged1':>7} {'fi':>7} {'fi-tc':>7}")
for D in (64, 128):
    for S in (1, 17, 33, 64, 200):
        bf = torch.bfloat16
        q = torch.randn(HQ, D, dtype=bf, device="cuda")
        k, v = (torch.randn(HKV, S, D, dtype=bf, device="cuda") for _ in "kv")
        row = {"single": lambda: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND"),
               "batch": lambda: pykda.batch_decode_with_padded_kv_cache(q[None], k[None], v[None], kv_layout="HND")}
        kp, vp = (x.permute(1, 0, 2).reshape(S, HKV, 1, D).contiguous() for x in (k, v))
        i32 = functools.partial(torch.tensor, dtype=torch.int32, device="cuda")
        dec = pykda.BatchDecodeWithPagedKVCache(kv_layout="HND")
        dec.plan(i32([0, S]), i32(list(range(S))), i32([1]), HQ, HKV, D, 1)
        row["paged1"] = lambda: dec.run(q[None], kp, vp)
        if flashinfer is not None:
            for name, tc in (("fi", False), ("fi-tc", True)):
                row[name] = functools.partial(flashinfer.single_decode_with_kv_cache, q, k, v, kv_layout="HND",
                                              use_tensor_cores=tc)
        ref = row["single"]().float()
        us = {}
        for name, fn in row.items():
            out = fn()
            err = ((out.reshape(ref.shape).float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, D, S, err)
            us[name] = timer.median_us(fn, warmup=5, repeats=50)
        print(f"{D:3d} {S:4d} " + " ".join(f"{us.get(n, float('nan')):7.2f}"
                                            for n in ("single", "batch", "paged1", "fi", "fi-tc")), flush=True)
