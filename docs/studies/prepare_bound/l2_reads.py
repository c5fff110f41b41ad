"""Is kda_prepare held by its DRAM traffic or by its own work? Its µs (torch.profiler, medians) at
issue 12's short rows with each head's q, k and g as given ("own"), and with every head reading
head 0's (a stride of 0 over H: "shared"), so that those reads come from L2 while it computes and
writes its records as before (β, 1/128 of the reads, stays each head's own). Run from a tree's root; any Hopper GPU."""
import pathlib
import sys

import torch

import pykda
from pykda.bench.kda import FLAGS, _inputs
from pykda.ops.kda import record_bytes

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "kda_scan"))
from kernels import kernel_median_us, profile_calls  # noqa: E402

ROWS = [(96, 8192), (64, 8192), (8, 131072)]
C = 16   # chunk_kda's default chunk


def prepare_us(seq, params, gate):
    call = lambda: pykda.chunk_kda(*seq, **params, **FLAGS[gate], state_v_first=True)  # noqa: E731
    return kernel_median_us(profile_calls(call, 7), "prepare")


print(torch.cuda.get_device_name())
for gate in ("softplus", "safe"):
    for H, T in ROWS:
        x, params, _, _ = _inputs(H, [T], False)
        names, K = ("q", "k", "v", "g", "beta"), x["q"].shape[-1]
        own = [x[n] for n in names]
        shared = [x[n][:, :, :1].expand(x[n].shape) if n in ("q", "k", "g") else x[n] for n in names]
        reads = 3 * T * H * K * 2
        writes = T // C * H * record_bytes(K, C)
        beta = T * H * 2
        t_own, t_shared = prepare_us(own, params, gate), prepare_us(shared, params, gate)
        print(f"{gate} H={H} T={T}: own {t_own:.1f} us ({(reads + beta + writes) / t_own / 1e6:.2f} TB/s of "
              f"DRAM traffic), shared {t_shared:.1f} us ({(beta + writes) / t_shared / 1e6:.2f} TB/s); "
              f"shared/own {t_shared / t_own:.3f}", flush=True)
