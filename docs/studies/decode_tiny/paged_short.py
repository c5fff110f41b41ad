"""Short paged calls (few rows, few CTAs) against the padded kernel at the same lengths (decode_tiny
where the planner takes it) and FlashInfer's paged wrapper on the same shuffled pages (CUDA-core and
tensor-core paths). µs, cold L2, median of 50. `bt`: the same pages as vLLM's block table
(`plan_block_tables`: no page ids copied by the plan, so decode_tiny reads where a request's ids
start, then the ids, then the rows). Run after `source .peers/activate.sh`, from the
repository root: `PYTHONPATH=. python docs/studies/decode_tiny/paged_short.py`."""
import functools

import numpy as np
import torch

import pykda
from pykda.bench import timing
from pykda.bench.paged_decode import _flashinfer_paged, shuffled_pages

timer, _ = timing.start("read")
SHAPES = [(1, 32, 8, 64, 17), (1, 32, 8, 128, 17), (1, 32, 8, 128, 64), (1, 8, 1, 128, 17), (1, 32, 32, 128, 33),
          (4, 32, 8, 128, 64), (16, 32, 8, 128, 32), (32, 32, 8, 128, 64)]
PAGES = (16, 1)
cols = ["padded"] + [f"{n}{p}" for p in PAGES for n in ("pg", "bt", "fi", "fitc")]
print(f"{'shape':>20} " + " ".join(f"{c:>7}" for c in cols))
for B, hq, hkv, D, S in SHAPES:
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(S + D + B)
    q = torch.randn(B, hq, D, dtype=bf, device="cuda", generator=g)
    k, v = (torch.randn(B, hkv, S, D, dtype=bf, device="cuda", generator=g) for _ in "kv")
    lens = np.full(B, S) if B == 1 else np.random.default_rng(B).integers(1, S + 1, B)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    row = [timer.median_us(functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND",
                                             kv_lens=kv_lens))]
    for page in PAGES:
        (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
        dec = pykda.BatchDecodeWithPagedKVCache("HND")
        dec.plan(indptr, indices, last, hq, hkv, D, page)
        row.append(timer.median_us(functools.partial(dec.run, q, kp, vp)))
        n = np.diff(indptr)
        table = torch.zeros(B, int(n.max()), dtype=torch.int32, device="cuda")
        for b in range(B):
            table[b, :n[b]] = indices[indptr[b]:indptr[b + 1]]
        bt = pykda.BatchDecodeWithPagedKVCache("HND")
        bt.plan_block_tables(table, lens.astype(np.int32), hq, hkv, D, page)
        row.append(timer.median_us(functools.partial(bt.run, q, kp, vp)))
        for tc in (False, True):
            fi = _flashinfer_paged(q, kp, vp, indptr, indices, last, "HND", page, tensor_cores=tc)
            row.append(timer.median_us(fi) if fi else float("nan"))
    print(f"{f'{B}x{hq}/{hkv} D{D} S{S}':>20} " + " ".join(f"{x:7.2f}" for x in row))
