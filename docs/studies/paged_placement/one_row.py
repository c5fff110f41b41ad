"""One row of placement.py (128 x 32/4 D 256 S 1024~, the paged grid's furthest from padded) for a
profiler: `python one_row.py padded|16|64|1 [repeats] [B:HQ/HKV:D:S]` runs the padded kernel, or
shuffled pages of that size, `repeats` times (default 3) after one warm-up call; the last argument
names another row of uneven lengths up to S (e.g. 256:32/8:128:64, the grid's one-tile row)."""
import sys

import torch

import pykda
from pykda.bench.decode import grid_inputs
from pykda.bench.paged_decode import shuffled_pages

what, repeats = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
row = sys.argv[3] if len(sys.argv) > 3 else "128:32/4:256:1024"
B, heads, D, S = row.split(":")
hq, hkv = (int(h) for h in heads.split("/"))
B, D, S = int(B), int(D), int(S)
q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven=True)
if what == "padded":
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    run = lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens)  # noqa: E731
else:
    page = int(what)
    (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
    dec = pykda.BatchDecodeWithPagedKVCache("HND")
    dec.plan(indptr, indices, last, hq, hkv, D, page)
    run = lambda: dec.run(q, kp, vp)  # noqa: E731
for _ in range(1 + repeats):
    run()
torch.cuda.synchronize()
print(what, "done")
