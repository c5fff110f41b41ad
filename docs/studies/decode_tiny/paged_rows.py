"""Where paged calls should stop taking decode_tiny: paged calls of S rows on decode_tiny (its
rows: 64 above 32) and on the pipeline, alternated per shape, pages of 16 and 1 (shuffled, HND).
µs, cold L2, median of 50. From the repository root: `PYTHONPATH=. python docs/studies/decode_tiny/paged_rows.py`."""
import functools

import numpy as np
import torch

import pykda
from pykda.bench import timing
from pykda.bench.paged_decode import shuffled_pages
from pykda.ops import decode, paged_decode

timer, _ = timing.start("read")
print(f"{'shape':>22} {'p16 tiny':>9} {'p16 pipe':>9} {'p1 tiny':>9} {'p1 pipe':>9}")
for B, hq, hkv, D in ((1, 32, 8, 128), (1, 32, 32, 128), (4, 32, 8, 128), (1, 32, 8, 64)):
    for S in (33, 40, 48, 56, 64):
        g = torch.Generator(device="cuda").manual_seed(S + D + B)
        q = torch.randn(B, hq, D, dtype=torch.bfloat16, device="cuda", generator=g)
        k, v = (torch.randn(B, hkv, S, D, dtype=torch.bfloat16, device="cuda", generator=g) for _ in "kv")
        lens = np.full(B, S) if B == 1 else np.random.default_rng(B + S).integers(1, S + 1, B)
        row = []
        for page in (16, 1):
            (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
            for rows in ((32, 64), (0,)):   # decode_tiny within 64 rows, or never (TMA and gathered pages alike)
                decode.TINY_ROWS = rows
                paged_decode.PREPARED.clear()
                dec = pykda.BatchDecodeWithPagedKVCache("HND")
                dec.plan(indptr, indices, last, hq, hkv, D, page)
                row.append(timer.median_us(functools.partial(dec.run, q, kp, vp)))
        print(f"{f'{B}x{hq}/{hkv} D{D} S{S}':>22} " + " ".join(f"{x:9.2f}" for x in row))
