"""Context-parallel KDA prefill over NCCL: one long sequence split across the GPUs of one host.

    torchrun --nproc-per-node 2 examples/cp_launch.py --seq-len 524288 --heads 8

Every rank makes the same inputs (one seed), keeps its contiguous slice of the tokens, and calls
`pykda.distributed.chunk_kda_cp` (Kimi Linear's gate, fp32 states, an initial state on rank 0).
It then checks its slice against one `chunk_kda` call over the whole sequence on its own GPU
(outputs, and the final state on the last rank; relative L2; beside them the error of a slice run
from zeros, which shows that the slices depend on each other, and the distance between one GPU's
segmented call and its serial chain, the scale of rounding differences) and times both (CUDA events, cold
L2, median; the CP time is the slowest rank's). The exchange's share is timed inside the call:
the all-gather of the slices' maps and the composition of the start state. Rank 0 prints a table.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist

import pykda
from pykda.bench.timing import Timer
from pykda.distributed import chunk_kda_cp, rank_start
from pykda.ops.kda import chunk_kda_slice

GATE = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def make_inputs(T: int, H: int, K: int, seed: int = 0) -> tuple[dict, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, s=1.0):
        return s * torch.randn(*shape, generator=gen, device="cuda")
    bf = torch.bfloat16
    # a long memory, so that every slice depends on the ones before it (random unit keys with
    # β ~ 0.5 forget within a few thousand tokens): β logits − 6, and decays of about 1 on half
    # the key dims (dt_bias −20: softplus ≈ 2e-9)
    dt_bias = rnd(H, K, s=0.5)
    dt_bias[:, ::2] = -20.0
    x = dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, H, K).to(bf),
             g=rnd(1, T, H, K).to(bf), beta=(rnd(1, T, H) - 6).to(bf),
             A_log=torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda")), dt_bias=dt_bias)
    return x, rnd(1, H, K, K, s=0.05)   # the initial state, fla's [B, H, K, V]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def median_ms(timer: Timer, fn, repeats: int) -> float:
    """This rank's median ms of fn, every repeat started together on all ranks, cold L2."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        timer.flush()
        torch.cuda.synchronize()
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=524288)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--tol", type=float, default=3e-3, help="largest relative L2 error against one chunk_kda call")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    T, H, K = args.seq_len, args.heads, args.head_dim
    x, s0 = make_inputs(T, H, K)
    lo, hi = rank * T // world, (rank + 1) * T // world
    part = {n: x[n][:, lo:hi] for n in ("q", "k", "v", "g", "beta")}
    gate = dict(GATE, A_log=x["A_log"], dt_bias=x["dt_bias"])
    init = s0 if rank == 0 else None

    # the check: this rank's slice against one call over the whole sequence
    o, fs = chunk_kda_cp(*part.values(), **gate, initial_state=init, output_final_state=True)
    o1, fs1 = pykda.chunk_kda(*(x[n] for n in ("q", "k", "v", "g", "beta")), **gate, initial_state=s0,
                              output_final_state=True)
    # what a wrong start would cost: this slice from zeros (rank 0's start is the initial state);
    # and how far one GPU's own two paths are apart (its segments against its serial chain)
    o0, _ = chunk_kda_slice(*part.values(), lambda total: torch.zeros_like(total[:, :, :K]), **gate)
    o2, fs2 = pykda.chunk_kda(*(x[n] for n in ("q", "k", "v", "g", "beta")), **gate, initial_state=s0,
                              output_final_state=True, segment_chunks=0)
    last = rank == world - 1
    errors = torch.tensor([rel(o, o1[:, lo:hi]), rel(fs, fs1) if last else 0.0,
                           rel(o0, o1[:, lo:hi]) if rank > 0 else 0.0, rel(o1, o2), rel(fs1, fs2)], device="cuda")
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)

    # the times: CP (slowest rank), the exchange inside it, and one GPU over the whole sequence
    timer = Timer()
    exchange = []

    def timed_start(total):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        start = rank_start(total, None, init)
        e.record()
        exchange.append((s, e))
        return start
    cp_ms = median_ms(timer, lambda: chunk_kda_slice(*part.values(), timed_start, **gate, output_final_state=True),
                      args.repeats)
    torch.cuda.synchronize()
    ex_ms = statistics.median(s.elapsed_time(e) for s, e in exchange)
    times = torch.tensor([cp_ms, ex_ms], device="cuda")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    one_ms = median_ms(timer, lambda: pykda.chunk_kda(*(x[n] for n in ("q", "k", "v", "g", "beta")), **gate,
                                                      initial_state=s0, output_final_state=True), args.repeats)
    ok = bool(errors[:2].max() <= args.tol)
    if rank == 0:
        cp_ms, ex_ms = times.tolist()
        print(f"{'GPUs':>4} {'T':>8} {'H':>3} {'K':>4} {'1 GPU ms':>9} {'CP ms':>8} {'speedup':>7} {'exchange ms':>11} "
              f"{'map MiB':>7} {'err out':>8} {'err state':>9} {'err from 0':>10} {'1 GPU seg/serial':>16}")
        mib = world * H * 2 * K * K * 4 / 2**20
        print(f"{world:>4} {T:>8} {H:>3} {K:>4} {one_ms:>9.3f} {cp_ms:>8.3f} {one_ms / cp_ms:>7.2f} {ex_ms:>11.3f} "
              f"{mib:>7.1f} {errors[0].item():>8.1e} {errors[1].item():>9.1e} {errors[2].item():>10.1e} "
              f"{errors[3].item():>8.1e}/{errors[4].item():.1e}")
        print("PASS" if ok else f"FAIL: relative error above {args.tol}")
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
