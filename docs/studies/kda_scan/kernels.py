"""Per-kernel device time of one chunk_kda call (torch.profiler, µs), softplus gate, no states, at
issue 12's rows (`short`: the two with the most scan steps). Run from a tree's root with PYTHONPATH
set to the tree under test."""
import sys

import torch

import pykda
from pykda.bench.kda import FLAGS, _inputs

ROWS = [(96, [8192]), (8, [131072]), (16, [65536]), (4, [262144]), (1, [1048576]), (8, [131072] + [1024] * 63)]
SHORT = [(4, [262144]), (1, [1048576])]
REPS = 5


def profile_calls(call, reps=REPS):
    """The device kernels of each of `reps` calls (after three warm-up calls), in launch order."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    n = len(kernels) // reps
    return [kernels[i * n:(i + 1) * n] for i in range(reps)]


def kernel_median_us(calls, name: str) -> float:
    """The median µs of the kernels whose name holds `name`, over `calls` (as profile_calls gives them)."""
    times = sorted(e.time_range.end - e.time_range.start for c in calls for e in c if name in e.name)
    return times[len(times) // 2]


def main():
    for H, lengths in SHORT if sys.argv[1:] == ["short"] else ROWS:
        x, params, cu, _ = _inputs(H, lengths, False)
        seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
        kw = dict(cu_seqlens=cu, cu_seqlens_cpu=cu.cpu()) if cu is not None else {}
        call = lambda: pykda.chunk_kda(*seq, **params, **FLAGS["softplus"], state_v_first=True, **kw)  # noqa: E731
        calls = profile_calls(call)
        span = sorted(c[-1].time_range.end - c[0].time_range.start for c in calls)[REPS // 2]
        mid = calls[REPS // 2]
        print(f"H={H} T={sum(lengths)} N={len(lengths)}: span {span:.1f} us | " + " | ".join(
            f"{e.name.split('(')[0].replace('kda_', '')} {e.time_range.end - e.time_range.start:.1f}" for e in mid))


if __name__ == "__main__":
    main()
