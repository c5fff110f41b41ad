"""The kernel or the memory? One padded NHD cache [B, S, Hkv, D] read four ways: as itself (PAGE 0),
as pages of 1 row ([B·S, 1, Hkv, D], request b's row r the page b·S + r) and as pages of 16 rows
([B·S/16, 16, Hkv, D], page b·S/16 + j), all over the same bytes; then pages of 1 and 16 in a dense
pool in the requests' order ([P, page, Hkv, D], no padding between requests). µs, cold L2, medians
of 50, two rounds; outputs against the padded one. From the repository root after
`source .peers/activate.sh`: `PYTHONPATH=. python docs/studies/pages_of_one/same_memory.py`."""
import functools

import numpy as np
import torch

import pykda
from pykda import reference
from pykda.bench import timing
from pykda.bench.decode import uneven_lengths

timer, _ = timing.start("read")
SHAPES = [(256, 32, 4, 256, 32), (256, 32, 8, 128, 64), (1024, 32, 8, 128, 64), (256, 32, 8, 64, 64)]
COLS = ("padded", "p1 same", "p16 same", "p1 dense", "p16 dense")


def paged(q, pages, page, lens, indices, hq, hkv, D):
    """A planned NHD run over `pages` [P, page, Hkv, D] (K and V alike), request b's pages `indices[b]`."""
    n = [len(i) for i in indices]
    indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    last = np.array([int(length) - (k - 1) * page for length, k in zip(lens, n)], np.int32)
    flat = torch.as_tensor(np.concatenate(indices).astype(np.int32), device="cuda")
    dec = pykda.BatchDecodeWithPagedKVCache("NHD")
    dec.plan(indptr, flat, last, hq, hkv, D, page)
    return functools.partial(dec.run, q, *pages)


def calls(B, hq, hkv, D, S):
    g = torch.Generator(device="cuda").manual_seed(S + D + B)
    q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, S, hkv, D, device="cuda", generator=g).to(torch.bfloat16) for _ in "kv")
    lens = uneven_lengths(B, S, seed=B)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    pages_of = lambda length, page: -(-int(length) // page)   # noqa: E731
    out = {"padded": functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="NHD",
                                       kv_lens=kv_lens)}
    for page in (1, 16):
        same = [x.reshape(B * S // page, page, hkv, D) for x in (k, v)]
        idx = [b * (S // page) + np.arange(pages_of(lens[b], page)) for b in range(B)]
        out[f"p{page} same"] = paged(q, same, page, lens, idx, hq, hkv, D)
        dense = [torch.cat([x[b, :pages_of(lens[b], page) * page] for b in range(B)]).reshape(-1, page, hkv, D)
                 for x in (k, v)]
        starts = np.concatenate([[0], np.cumsum([pages_of(n, page) for n in lens])])
        idx = [np.arange(starts[b], starts[b + 1]) for b in range(B)]
        out[f"p{page} dense"] = paged(q, dense, page, lens, idx, hq, hkv, D)
    return out


print(f"{'shape':>22} " + " ".join(f"{c:>9}" for c in COLS) + "   max err")
made = [(s, calls(*s)) for s in SHAPES]
for rnd in range(2):
    for (B, hq, hkv, D, S), fns in made:
        ref = fns["padded"]().float().cpu().numpy()
        err = max(reference.relative_error(fns[c]().float().cpu().numpy(), ref) for c in COLS[1:])
        print(f"{f'{B}x{hq}/{hkv} D{D} S{S}~':>22} " + " ".join(f"{timer.median_us(fns[c]):9.2f}" for c in COLS) +
              f"   {err:.1e}", flush=True)
