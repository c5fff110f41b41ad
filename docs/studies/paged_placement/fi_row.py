"""The longest paged row where FlashInfer's tensor-core path leads on shuffled pages of 64 (2 x 64/4 D 128
KV 500000, H100 session 58: 680.8 us against pykda's 691.4, padded 677.2), for a profiler:
`python fi_row.py [page]` warms pykda's padded and paged calls and FlashInfer's paged wrapper (both
paths) up, prints their CUDA-event medians, then runs each once between cudaProfilerStart/Stop
(`ncu --profile-from-start off` profiles just those launches). Needs `.peers/activate.sh` sourced."""
import sys

import torch

import pykda
from pykda.bench import timing
from pykda.bench.decode import grid_inputs
from pykda.bench.paged_decode import _flashinfer_paged, shuffled_pages

B, hq, hkv, D, S = 2, 64, 4, 128, 500000
page = int(sys.argv[1]) if len(sys.argv) > 1 else 64
q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven=False)
kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
(kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
dec = pykda.BatchDecodeWithPagedKVCache("HND")
dec.plan(indptr, indices, last, hq, hkv, D, page)
calls = {
    "pykda padded": lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens),
    f"pykda pages of {page}": lambda: dec.run(q, kp, vp),
    f"fi pages of {page}": _flashinfer_paged(q, kp, vp, indptr, indices, last, "HND", page),
    f"fi-tc pages of {page}": _flashinfer_paged(q, kp, vp, indptr, indices, last, "HND", page, tensor_cores=True),
}
timer = timing.Timer()
for name, fn in calls.items():
    print(f"{name:24s} {timer.median_us(fn):8.1f} us" if fn else f"{name:24s} (not run)")
torch.cuda.synchronize()
torch.cuda.profiler.start()
for fn in calls.values():
    if fn:
        fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
