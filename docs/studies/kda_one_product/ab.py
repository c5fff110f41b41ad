"""chunk_kda's ms on issue 12's rows with the pykda that PYTHONPATH finds (cold L2, median of 20;
softplus gate), then bench kda's accuracy rows (T 4096, H 8, fp32 state, both gates, against the
float64 recurrence) and the outputs of one call saved for a comparison of two trees.
`python ab.py LABEL OUT_DIR [--accuracy]`."""
import sys

import torch

from pykda.bench import kda as bench, timing

ROWS = [(96, [8192], True), (96, [1300, 547, 2048, 963, 271, 3063], True), (64, [8192], True),
        (64, [1024] * 8, True), (32, [8192], False), (16, [65536], False), (8, [131072], False),
        (1, [1048576], False), (8, [131072] + [1024] * 63, False)]
# the short rows at other chains than the planner's (8 warps: wgmma; 2 and 4: mma.sync), whose
# balance the branch may move (kda.py's WGMMA_CHAINS_SHARE)
WARPS_ROWS = [(96, [8192], True, 4), (96, [8192], True, 2), (64, [8192], True, 8)]

label, out_dir = sys.argv[1], sys.argv[2]
timer, _ = timing.start("read")
for H, lengths, state, warps in [row + (None,) for row in ROWS] + WARPS_ROWS:
    x, params, cu, h0 = bench._inputs(H, lengths, state)
    ours = bench._runners(x, params, cu, h0, {}, "softplus")["pykda"]
    call = (lambda: ours(warps=warps)) if warps else ours
    call()
    ms = timer.median_us(call, warmup=3, repeats=20) / 1e3
    print(f"{label:8} H={H:<3d} T={sum(lengths):<8d} N={len(lengths):<3d} state={state!s:5} "
          f"warps={warps or 'auto'} {ms:8.3f} ms", flush=True)
    del x, params, cu, h0, ours, call
    torch.cuda.empty_cache()
x, params, cu, h0 = bench._inputs(8, [4096], True, seed=2)
for gate in bench.GATES:
    o, s = bench._runners(x, params, cu, h0, {}, gate)["pykda"]()
    torch.save({"out": o.float().cpu(), "state": s.float().cpu()}, f"{out_dir}/{label}_{gate}.pt")
if "--accuracy" in sys.argv:
    for gate, ops in bench._accuracy({}).items():
        print(f"{label:8} accuracy {gate}: out {ops['pykda']['out']:.3e}, final state {ops['pykda']['state']:.3e}")
