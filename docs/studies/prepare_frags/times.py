"""kda_prepare's device time and the whole call's span (torch.profiler, µs, medians of REPS calls)
at issue 12's rows, Kimi Linear's softplus gate and the safe (bounded) gate, for the tree on
PYTHONPATH; also the call's output, saved to compare trees (`--save DIR`). Run from a tree's root."""
import pathlib
import sys

import torch

import pykda
from pykda.bench.kda import FLAGS, _inputs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "kda_scan"))
from kernels import kernel_median_us, profile_calls  # noqa: E402

ROWS = [(96, [8192]), (64, [8192]), (8, [131072]), (1, [1048576]), (8, [131072] + [1024] * 63)]
REPS = 7


def profile(call):
    """kda_prepare's median µs over REPS calls, and the calls' median span."""
    calls = profile_calls(call, REPS)
    span = sorted(c[-1].time_range.end - c[0].time_range.start for c in calls)[REPS // 2]
    return kernel_median_us(calls, "prepare"), span


save = sys.argv[sys.argv.index("--save") + 1] if "--save" in sys.argv else None
for gate in ("softplus", "safe"):
    for H, lengths in ROWS:
        x, params, cu, _ = _inputs(H, lengths, False)
        seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
        kw = dict(cu_seqlens=cu, cu_seqlens_cpu=cu.cpu()) if cu is not None else {}
        call = lambda: pykda.chunk_kda(*seq, **params, **FLAGS[gate], state_v_first=True, **kw)  # noqa: E731
        prep, span = profile(call)
        name = f"{gate} H={H} T={sum(lengths)} N={len(lengths)}"
        if save:
            torch.save(call()[0].cpu(), f"{save}/{name.replace(' ', '_')}.pt")
        print(f"{name}: prepare {prep:.1f} us, span {span:.1f} us", flush=True)
