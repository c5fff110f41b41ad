"""Compile FlashInfer's decode kernels that `bench decode` / `bench paged-decode` call, all at once.

FlashInfer JIT-compiles a module per (path, head dim, dtype) at its first call (10-30 s each with
the device's nvcc), which used to eat whole bench calls. This starts one process per module (a tiny
call of each path), so the modules build side by side on the device's cores; a bench started
afterwards finds them in FlashInfer's JIT cache ($FLASHINFER_WORKSPACE_BASE, the peers' activate.sh
sets it). Run after `source .peers/activate.sh`: `python docs/studies/flashinfer_warm/warm.py`.
"""
import itertools
import subprocess
import sys
import time

HEAD_DIMS = (64, 128, 256)
PATHS = ("single", "batch")   # single_decode_with_kv_cache; the paged wrapper
TENSOR_CORES = (False, True)


def one(path: str, d: int, tc: bool) -> None:
    """One tiny call of a path (32 query heads over 8 KV heads, 16 rows, bf16, HND)."""
    import flashinfer
    import torch
    bf = torch.bfloat16
    hq, hkv, S = 32, 8, 16
    q = torch.randn(hq, d, dtype=bf, device="cuda")
    k, v = (torch.randn(hkv, S, d, dtype=bf, device="cuda") for _ in "kv")
    if path == "single":
        flashinfer.single_decode_with_kv_cache(q, k, v, kv_layout="HND", use_tensor_cores=tc)
    else:
        ws = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
        i32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")   # noqa: E731
        w.plan(i32([0, 1]), i32([0]), i32([S]), hq, hkv, d, S, q_data_type=bf, kv_data_type=bf)
        w.run(q[None], (k[None], v[None]))
    torch.cuda.synchronize()


def main() -> int:
    if len(sys.argv) == 4:
        one(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1")
        return 0
    t0 = time.time()
    jobs = {(p, d, tc): subprocess.Popen([sys.executable, __file__, p, str(d), str(int(tc))],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for p, d, tc in itertools.product(PATHS, HEAD_DIMS, TENSOR_CORES)}
    failed = 0
    for key, proc in jobs.items():
        _, err = proc.communicate()
        if proc.returncode:
            failed += 1
            print(f"{key}: exit {proc.returncode}: {err.decode()[-300:]}")
    print(f"flashinfer warm: {len(jobs) - failed} of {len(jobs)} paths built in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
