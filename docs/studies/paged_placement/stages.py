"""Do shuffled pages stream better with more CTAs an SM? The paged grid's rows where FlashInfer's
tensor-core path led on pages of 64 (session 58/59, H100), pykda's pages of 64 (shuffled over the
pool, HND, the grid's) planned with the planner's stages and with 2 and 3 (fewer stages: more CTAs
an SM, as FlashInfer's 264 CTAs of 70 KB against pykda's 132 of 132 KB on 2 x 64/4 KV 500000), the
padded kernel beside. Cold L2, median of 50; µs. Run from the repository root:
`PYTHONPATH=. python docs/studies/paged_placement/stages.py`."""
import torch

import pykda
from pykda.bench import timing
from pykda.bench.decode import grid_inputs
from pykda.bench.paged_decode import shuffled_pages

ROWS = [(2, 64, 4, 128, 500000, False), (2, 32, 4, 128, 200000, True), (8, 8, 1, 256, 131072, True),
        (64, 32, 8, 128, 4096, False), (128, 16, 16, 128, 3000, True), (8, 32, 8, 128, 32768, False)]
timer, _ = timing.start("read")
print(f"{'row':>26} {'padded':>8} " + " ".join(f"{'p64 s' + str(s or 'plan'):>10}" for s in (None, 2, 3)))
for B, hq, hkv, D, S, uneven in ROWS:
    q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    cells = [timer.median_us(lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens))]
    (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, 64, seed=64)
    for stages in (None, 2, 3):
        dec = pykda.BatchDecodeWithPagedKVCache("HND")
        dec.plan(indptr, indices, last, hq, hkv, D, 64, stages=stages)
        cells.append(timer.median_us(lambda: dec.run(q, kp, vp)))
    tag = f"{B}x{hq}/{hkv} D{D} S{S}{'~' if uneven else ''}"
    print(f"{tag:>26} " + " ".join(f"{c:8.1f}  " for c in cells), flush=True)
    del q, k, v, kp, vp
    torch.cuda.empty_cache()
