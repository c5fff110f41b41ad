"""One sequence of a few rows (issue 13's worst grid row is 32/8 KV 17 D 64): pykda's padded single
and batched decode (TMA boxes), the same with the rows gathered by cp.async (`gather`: a tree with
decode.PADDED_GATHER_ROWS, set to 64 here), its paged decode on pages of one row (the gather behind
a page table) and FlashInfer's single decode on both of its paths, µs, cold L2, median of 50, HND.
Run after `source .peers/activate.sh`: `python tiny.py`."""
import functools

import torch

import pykda
from pykda.bench import timing
from pykda.ops import decode


def gathering(rows: int):
    """Calls made after this gather padded sequences of at most `rows` rows (0: none)."""
    decode.PADDED_GATHER_ROWS = rows
    decode.PREPARED.results.clear()
    decode.PREPARED.last = (None, None)


timer, _ = timing.start("read")
HQ, HKV = 32, 8
try:
    import flashinfer
except ImportError:
    flashinfer = None
GATHER = hasattr(decode, "PADDED_GATHER_ROWS")
NAMES = ("single", "batch") + (("single-g", "batch-g") if GATHER else ()) + ("paged1", "fi", "fi-tc")
print(f"{'D':>3} {'S':>4} " + " ".join(f"{n:>8}" for n in NAMES))
for D in (64, 128):
    for S in (1, 17, 33, 64, 200):
        bf = torch.bfloat16
        q = torch.randn(HQ, D, dtype=bf, device="cuda")
        k, v = (torch.randn(HKV, S, D, dtype=bf, device="cuda") for _ in "kv")
        single = lambda: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND")   # noqa: E731
        batch = lambda: pykda.batch_decode_with_padded_kv_cache(q[None], k[None], v[None], kv_layout="HND")   # noqa: E731
        row = {"single": single, "batch": batch}
        if GATHER:
            row["single-g"], row["batch-g"] = single, batch
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
            if GATHER:
                gathering(64 if name.endswith("-g") else 0)
            out = fn()
            err = ((out.reshape(ref.shape).float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, D, S, err)
            us[name] = timer.median_us(fn, warmup=5, repeats=50)
        print(f"{D:3d} {S:4d} " + " ".join(f"{us.get(n, float('nan')):8.2f}" for n in NAMES), flush=True)
