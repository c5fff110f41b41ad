"""The paged grid's one row a peer leads on this tree (session 60, H100): 4 x 16/16 KV 65536~ D 64 on
shuffled pages of 16, pykda 288.8 µs against FlashInfer's CUDA-core path 283.5 (padded 279.1, pages
of 64 280.7). At D 64 a 128-row tile on pages of 16 takes 16 TMA copies of 2 KB (box-major tiles
only join sub-tiles, and D 64 has one). Do the stages or a chunked split instead of the balanced one
move it? The D 64 uneven rows of the grid, pages of 16 and 64 (HND, shuffled over the pool), the
planner's plan against stages 2 and 4 and chunks of 8192 rows; padded and FlashInfer's two paths
beside. Cold L2, median of 50; µs. Run from the repository root:
`PYTHONPATH=. python docs/studies/paged_placement/d64_pages.py`; with `--gather`, the plan only, its
pages of 16 gathered row by row with cp.async as pages of 8 are (decode.TMA_MIN_PAGE raised to 32 in
this process)."""
import sys
import torch

import pykda
from pykda.bench import timing
from pykda.bench.decode import grid_inputs
from pykda.bench.paged_decode import _flashinfer_paged, shuffled_pages
from pykda.ops import decode

GATHER = sys.argv[1:] == ["--gather"]
if GATHER:
    decode.TMA_MIN_PAGE = 32

ROWS = [(4, 16, 16, 64, 65536), (32, 32, 8, 64, 8192), (256, 32, 8, 64, 2048)]
SETTINGS = {"plan": {}} if GATHER else {"plan": {}, "s2": dict(stages=2), "s4": dict(stages=4),
                                         "chunk 8192": dict(chunk_size=8192)}
timer, _ = timing.start("read")
print(f"{'row':>26} {'page':>4} {'padded':>8} " + " ".join(f"{s:>10}" for s in SETTINGS) + f" {'fi':>8} {'fi-tc':>8}")
for B, hq, hkv, D, S in ROWS:
    q, k, v, lens = grid_inputs(B, hq, hkv, D, S, True)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    padded = timer.median_us(lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens))
    for page in (16,) if GATHER else (16, 64):
        (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
        cells = []
        for kw in SETTINGS.values():
            dec = pykda.BatchDecodeWithPagedKVCache("HND")
            try:
                dec.plan(indptr, indices, last, hq, hkv, D, page, **kw)
                cells.append(timer.median_us(lambda: dec.run(q, kp, vp)))
            except ValueError:
                cells.append(float("nan"))
        for tc in (False, True):
            fi = _flashinfer_paged(q, kp, vp, indptr, indices, last, "HND", page, tensor_cores=tc)
            cells.append(timer.median_us(fi) if fi else float("nan"))
        tag = f"{B}x{hq}/{hkv} D{D} S{S}~"
        if GATHER:   # the gathered pages' output against the padded kernel's
            ref = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens).float()
            print(f"{tag}: max |gathered - padded| {float((dec.run(q, kp, vp).float() - ref).abs().max()):.1e}")
        print(f"{tag:>26} {page:4d} {padded:8.1f} " + " ".join(f"{c:10.1f}" for c in cells[:-2]) +
              f" {cells[-2]:8.1f} {cells[-1]:8.1f}", flush=True)
        del kp, vp
    del q, k, v
    torch.cuda.empty_cache()
