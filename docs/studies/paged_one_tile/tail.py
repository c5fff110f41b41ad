"""Streaming (many-tile) rows on pages of 8-128 rows: pykda's padded kernel, then the paged run on
each page size, four pool layouts (shuffled by seeds page, 7 and 1000; the pages in request order),
µs, cold L2, medians of 50. Session 53 found 256 x 64/8 KV 513~ D 128 at 102 µs on pages of 64 and
128 against 94.5 on pages of 16 in every layout: the last page of a request read whole. Run from the
repository root after `source .peers/activate.sh`, once per tree (an A/B alternates trees by
PYTHONPATH): `PYTHONPATH=. python docs/studies/paged_one_tile/tail.py`."""
import functools

import torch

import pykda
from pykda.bench import timing
from pykda.bench.decode import uneven_lengths
from pykda.bench.paged_decode import shuffled_pages

timer, _ = timing.start("read")
for B, hq, hkv, S, d in [(256, 64, 8, 513, 128), (256, 8, 1, 4096, 128), (128, 32, 4, 1024, 256)]:
    g = torch.Generator(device="cuda").manual_seed(S + hkv + B + d)   # as bench paged-decode --grid
    q = torch.randn(B, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, hkv, S, d, device="cuda", generator=g).to(torch.bfloat16) for _ in "kv")
    lens = uneven_lengths(B, S, seed=S + B)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    padded = functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens)
    print(f"{B}x{hq}/{hkv}:{S}~ D{d} padded {timer.median_us(padded):7.2f}")
    for page in (8, 16, 32, 64, 128):
        res = []
        for seed in (page, 7, 1000, None):
            (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=seed or 0)
            if seed is None:   # the same pages in request order
                kp, vp = kp[indices.long()], vp[indices.long()]
                indices = torch.arange(indices.numel(), dtype=torch.int32, device="cuda")
            dec = pykda.BatchDecodeWithPagedKVCache("HND")
            dec.plan(indptr, indices, last, hq, hkv, d, page)
            res.append(timer.median_us(functools.partial(dec.run, q, kp, vp)))
        print(f"  p{page:<4} " + " ".join(f"{x:7.2f}" for x in res))
