"""32/32 KV 8192 D 128 (HND, 134 MB) for a profiler, beside the read floor's kernels on the same
bytes: `python split_row.py decode [chunk_size]` runs pykda's single decode (the planner's split, or
chunks of `chunk_size` rows); `python split_row.py bulk CTAS CHUNK STAGES` / `vec U B` the read
kernels of read_floor.py over 134 MB. One warm-up call, then three."""
import sys

import torch

from read_floor import ReadKernels

what = sys.argv[1]
if what == "decode":
    import pykda
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else None
    q = torch.randn(32, 128, device="cuda").bfloat16()
    k = torch.randn(32, 8192, 128, device="cuda").bfloat16()
    v = torch.randn(32, 8192, 128, device="cuda").bfloat16()
    run = lambda: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND", chunk_size=chunk)  # noqa: E731
else:
    n = 2 * 32 * 8192 * 128 * 2
    buf = torch.zeros(n, dtype=torch.uint8, device="cuda")
    run = ReadKernels().runner(what, [int(a) for a in sys.argv[2:]], buf)
for _ in range(4):
    run()
torch.cuda.synchronize()
print(what, "done")
