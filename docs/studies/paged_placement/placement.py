"""Is the paged decode's distance from the padded one the pages' placement in the pool? On the
paged grid's rows furthest from padded (session 55), µs of the padded kernel and of the same rows
in HND pages placed four ways: shuffled over the whole pool (the grid's), in request order (page j
of request b right after page j - 1), shuffled inside windows of 2 MB of the pool, and shuffled
whole requests (each request's pages in order, the requests in random order). Pages of 16, 64
and 1 (and shuffled pages of 32 and 128). Cold L2, median of 50. Run from the repository root:
`PYTHONPATH=. python docs/studies/paged_placement/placement.py`."""
import functools
import sys

import numpy as np
import torch

import pykda
from pykda.bench import timing
from pykda.bench.decode import grid_inputs
from pykda.bench.paged_decode import shuffled_pages

timer, copy_tbs = timing.start("read")
ROWS = [(128, 32, 4, 256, 1024, True), (64, 128, 8, 128, 2048, True), (256, 8, 1, 128, 4096, True),
        (64, 32, 8, 128, 8192, True), (16, 32, 32, 128, 8191, True), (256, 64, 8, 128, 513, True),
        (8, 32, 8, 128, 32768, False), (2, 64, 4, 128, 500000, False)]
if len(sys.argv) > 1:
    ROWS = ROWS[:int(sys.argv[1])]


def placement(n_pages: list, page_bytes: int, how: str, seed: int) -> torch.Tensor:
    """Pool page of every (request, page j) in request order, as a permutation of the pool."""
    total = sum(n_pages)
    g = torch.Generator().manual_seed(seed)
    if how == "shuffled":
        return torch.randperm(total, generator=g)
    if how == "ordered":
        return torch.arange(total)
    if how == "window":   # shuffled inside windows of 2 MB of the pool
        w = max(1, (2 << 20) // page_bytes)
        perm = torch.arange(total)
        for s in range(0, total, w):
            e = min(total, s + w)
            perm[s:e] = s + torch.randperm(e - s, generator=g)
        return perm
    if how == "requests":   # whole requests in order inside, requests shuffled
        order = torch.randperm(len(n_pages), generator=g).tolist()
        starts = np.concatenate([[0], np.cumsum([n_pages[b] for b in order])])
        at = {b: int(starts[i]) for i, b in enumerate(order)}
        return torch.cat([at[b] + torch.arange(n_pages[b]) for b in range(len(n_pages))])
    raise ValueError(how)


# (page, placement) columns: every placement on pages of 16, 64 and 1, and shuffled pages of 32 and 128
# (a 32-row box as on pages of 64, with twice the page ids; boxes of 16 rows as on pages of 16)
COLS = [(p, h) for p in (16, 64, 1) for h in ("shuffled", "ordered", "window", "requests")] + \
    [(32, "shuffled"), (128, "shuffled")]
print(f"copy {copy_tbs:.2f} TB/s")
print(f"{'shape':>26} {'padded':>8} " + " ".join(f"{f'p{p} {h[:4]}':>10}" for p, h in COLS), flush=True)
for B, hq, hkv, D, S, uneven in ROWS:
    q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    padded = functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens)
    o_pad = padded().float()
    cols = [timer.median_us(padded)]
    worst = 0.0
    for page, how in COLS:
        place = functools.partial(placement, page_bytes=page * hkv * D * 2, how=how, seed=page)
        (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page, placement=place)
        dec = pykda.BatchDecodeWithPagedKVCache("HND")
        dec.plan(indptr, indices, last, hq, hkv, D, page)
        run = functools.partial(dec.run, q, kp, vp)
        worst = max(worst, float((run().float() - o_pad).abs().max()))
        cols.append(timer.median_us(run))
        del kp, vp, dec, run
        torch.cuda.empty_cache()
    tag = f"{B}x{hq}/{hkv} D{D} S{S}{'~' if uneven else ''}"
    print(f"{tag:>26} " + " ".join(f"{c:8.2f}" if i == 0 else f"{c:10.2f}" for i, c in enumerate(cols))
          + f"   max |paged - padded| {worst:.1e}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
