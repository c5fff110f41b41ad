"""Streaming pages of 16 rows: TMA boxes (a box a page, four a 64-row tile: today's rule,
decode.TMA_MIN_PAGE = 16) or the producer warp's row gather (as pages of 1 and 8, which after
session 54 ran 1-2 % under pages of 16 on three of session 54's long rows)? Over the batched rows
of `bench decode --grid` (those `bench paged-decode --grid` runs), shuffled HND pages as the
paged grid's: µs of the padded kernel, of pages of 16 in boxes and gathered, and of pages of 8
(gathered), cold L2, median of 50; each paged output's distance from the padded one. Run from the
repository root: `PYTHONPATH=. python docs/studies/pages_of_16/gather_or_boxes.py` (the gathered
pages of 16 compile at first use: they are not registered kernels)."""
import functools

import numpy as np
import torch

import pykda
from pykda import reference
from pykda.bench import timing
from pykda.bench.decode import GRID, uneven_lengths
from pykda.bench.paged_decode import shuffled_pages
from pykda.ops import decode, paged_decode

timer, _ = timing.start("read")


def gathering_below(rows: int) -> None:
    """Gather pages of fewer than `rows` rows (decode.TMA_MIN_PAGE), forgetting every plan and
    prepared run made under the other rule."""
    decode.TMA_MIN_PAGE = rows
    decode.decode_spec.cache_clear()
    paged_decode.PREPARED.clear()


def paged_us(q, lens, kv, page: int, gather_below: int, o_pad) -> tuple[float, float]:
    gathering_below(gather_below)
    (kp, vp), indptr, indices, last = shuffled_pages(kv, lens, page, seed=page)
    dec = pykda.BatchDecodeWithPagedKVCache("HND")
    dec.plan(indptr, indices, last, q.shape[1], kv[0].shape[1], q.shape[2], page)
    run = functools.partial(dec.run, q, kp, vp)
    err = reference.relative_error(run().float().cpu().numpy(), o_pad)
    us = timer.median_us(run)
    gathering_below(16)
    return us, err


print(f"{'shape':>24} {'padded':>8} {'p16 box':>8} {'p16 gat':>8} {'p8 gat':>8} {'gat/box':>8}   max err")
ratios = []
for B, hq, hkv, D, S, uneven in [r for r in GRID if r[0] > 1]:
    g = torch.Generator(device="cuda").manual_seed(S + hkv + B + D)
    q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in "kv")
    lens = uneven_lengths(B, S, seed=S + B) if uneven else np.full(B, S)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    padded = functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens)
    o_pad = padded().float().cpu().numpy()
    cols = [timer.median_us(padded)]
    errs = []
    for page, below in ((16, 16), (16, 32), (8, 16)):
        us, err = paged_us(q, lens, (k, v), page, below, o_pad)
        cols.append(us)
        errs.append(err)
    ratios.append(cols[2] / cols[1])
    print(f"{f'{B}x{hq}/{hkv} D{D} S{S}{chr(126) if uneven else chr(32)}':>24} " +
          " ".join(f"{x:8.2f}" for x in cols) + f" {cols[2] / cols[1]:8.3f}   {max(errs):.1e}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
print(f"gathered / boxed pages of 16: min {min(ratios):.3f}, median {float(np.median(ratios)):.3f}, "
      f"max {max(ratios):.3f} over {len(ratios)} rows")
