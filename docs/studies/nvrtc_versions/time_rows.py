"""chunk_kda's ms on issue 12's rows in both state layouts (fla's [N, H, K, V] and V-first), with
the kernels that PYKDA_CACHE_DIR holds (cold L2, median of 20, softplus gate, initial and final
state). `python time_rows.py LABEL`."""
import sys

import torch

from pykda import chunk_kda
from pykda.bench import kda as bench, timing

ROWS = [(96, [8192]), (64, [8192]), (64, [1024] * 8), (96, [1300, 547, 2048, 963, 271, 3063]), (8, [131072]),
        (16, [65536])]

label = sys.argv[1]
timer, _ = timing.start("read")
for H, lengths in ROWS:
    x, params, cu, h0 = bench._inputs(H, lengths, True)
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    for v_first in (False, True):
        call = lambda: chunk_kda(*seq, **params, **bench.FLAGS["softplus"], state_v_first=v_first,  # noqa: E731
                                 initial_state=h0, output_final_state=True, cu_seqlens=cu)
        call()
        ms = timer.median_us(call, warmup=3, repeats=20) / 1e3
        print(f"{label:6} H={H:<3d} T={sum(lengths):<7d} N={len(lengths):<2d} "
              f"{'v_first' if v_first else 'fla    '} {ms:7.3f} ms", flush=True)
    del x, params, cu, h0, seq
    torch.cuda.empty_cache()
