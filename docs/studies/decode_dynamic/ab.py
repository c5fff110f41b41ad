"""Dynamic walk (whole units from a counter) against the planner's chunks, the decode grid's batched rows:
padded with kv_lens, and shuffled HND pages of 16 and 1 rows. Alternated, cold L2, µs."""
import sys
import numpy as np
import torch
import pykda
from pykda.bench.timing import Timer
from pykda.bench.decode import GRID, uneven_lengths
from pykda.ops import decode, paged_decode

timer = Timer()
pays = decode.dynamic_pays


def mode(dyn):
    decode.dynamic_pays = (lambda *a: True) if dyn else (lambda *a: False)
    decode.plan_decode.cache_clear()
    decode.PREPARED.clear()
    paged_decode.PREPARED.clear()


def ab(fn_of_mode):
    outs, ts = {}, {False: [], True: []}
    for rep in range(2):
        for dyn in (False, True):
            mode(dyn)
            f = fn_of_mode()
            outs[dyn] = f().float()
            ts[dyn].append(timer.median_us(f, repeats=30))
    return min(ts[False]), min(ts[True]), (outs[True] - outs[False]).abs().max().item()


rows = [r for r in GRID if r[0] > 1]
only = sys.argv[1:]
print(f"{'shape':>28} {'cache':>6} {'chunks':>8} {'dynamic':>8} {'x':>5} {'maxdiff':>8}", flush=True)
for B, hq, hkv, d, S, uneven in rows:
    label = f"{B}x{hq}/{hkv} {S}{'~' if uneven else ''} D{d}"
    lens = uneven_lengths(B, S, seed=S + B) if uneven else np.full(B, S)
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda()
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    c, dy, md = ab(lambda: (lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kl)))
    print(f"{label:>28} {'padded':>6} {c:8.1f} {dy:8.1f} {c / dy:5.2f} {md:8.1e}", flush=True)
    del k, v
    torch.cuda.empty_cache()
    for page in (16, 1):
        kc = torch.randn(int(sum(-(-int(n) // page) for n in lens)) + 3, hkv, page, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        pages = [-(-int(n) // page) for n in lens]
        perm = np.random.default_rng(0).permutation(kc.shape[0]).astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = torch.from_numpy(perm[:indptr[-1]].copy()).cuda()
        last = np.array([n - (p - 1) * page for n, p in zip(lens, pages)], np.int32)

        def make():
            dec = pykda.BatchDecodeWithPagedKVCache("HND")
            dec.plan(torch.from_numpy(indptr), indices, torch.from_numpy(last), hq, hkv, d, page)
            return lambda: dec.run(q, kc, vc)
        c, dy, md = ab(make)
        print(f"{label:>28} {'p' + str(page):>6} {c:8.1f} {dy:8.1f} {c / dy:5.2f} {md:8.1e}", flush=True)
        del kc, vc
        torch.cuda.empty_cache()
mode(False)
