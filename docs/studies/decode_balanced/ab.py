"""A/B: the balanced split (balanced=True, at each UNIT_COST given: `python ab.py 0,1,2`) against the chunked one
(balanced=False), same call otherwise: HND caches, kv_lens on the device, cold L2, best of two
alternated medians; `copy` a device copy reading as many bytes. Run from the repository root with PYTHONPATH=.
"""
import sys
import numpy as np
import torch
import pykda
from pykda.bench.timing import Timer
from pykda.bench.decode import uneven_lengths

ROWS = [(2, 32, 4, 128, 200000, 1), (4, 16, 16, 64, 65536, 1), (8, 8, 1, 256, 131072, 1), (16, 32, 32, 128, 8191, 1),
        (16, 64, 8, 128, 16384, 1), (32, 32, 8, 64, 8192, 1), (64, 32, 8, 128, 8192, 1), (64, 128, 8, 128, 2048, 1),
        (128, 16, 16, 128, 3000, 1), (128, 32, 4, 256, 1024, 1), (256, 32, 8, 64, 2048, 1), (256, 64, 8, 128, 513, 1),
        (256, 8, 1, 128, 4096, 1), (32, 64, 4, 128, 65536, 1),
        (8, 32, 8, 128, 32768, 0), (64, 32, 8, 128, 4096, 0), (1, 32, 32, 128, 8192, 0), (1, 32, 4, 128, 200000, 0),
        (1, 64, 8, 128, 50000, 0), (1, 32, 8, 64, 17, 0), (1, 16, 16, 64, 100003, 0)]
from pykda.ops import decode
COSTS = [int(c) for c in sys.argv[1].split(",")] if len(sys.argv) > 1 else [decode.BALANCED_UNIT_COST]


def with_cost(c):
    decode.BALANCED_UNIT_COST = c
    decode.decode_spec.cache_clear()
    decode.PREPARED.clear()


timer = Timer()
print(f"{'shape':>28} {'MB':>7} {'chunked':>8} " + " ".join(f"{'bal' + str(c):>8}" for c in COSTS) + f" {'x best':>6} {'copy':>7} {'%c ch':>6} {'%c bal':>6} {'maxdiff':>8}")
for B, hq, hkv, d, S, uneven in ROWS:
    torch.manual_seed(0)
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    lens = uneven_lengths(B, S, seed=S + B) if uneven else np.full(B, S)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32).cuda()
    nbytes = int(lens.sum()) * hkv * d * 2 * 2
    call = lambda bal: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens, balanced=bal)
    ref = call(False).float()
    t = {c: [] for c in ["ch"] + COSTS}
    diff = 0.0
    for _ in range(2):
        for c in t:
            if c == "ch":
                t[c].append(timer.median_us(lambda: call(False), repeats=40))
            else:
                with_cost(c)
                diff = max(diff, (call(True).float() - ref).abs().max().item())
                t[c].append(timer.median_us(lambda: call(True), repeats=40))
    ch = min(t["ch"])
    ba = min(min(t[c]) for c in COSTS)
    cp = timer.copy_us(nbytes // 2) if nbytes >= (8 << 20) else float("nan")   # read nbytes: a copy of half reads+writes as many
    label = f"{B}x{hq}/{hkv} {S}{'~' if uneven else ''} D{d}"
    print(f"{label:>28} {nbytes / 1e6:7.0f} {ch:8.1f} " + " ".join(f"{min(t[c]):8.1f}" for c in COSTS) +
          f" {ch / ba:6.2f} {cp:7.1f} {100 * cp / ch:6.0f} {100 * cp / ba:6.0f} {diff:8.1e}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
