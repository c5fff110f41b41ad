"""`python -m pykda bench kda`: KDA prefill (chunk_kda) vs FlashKDA and fla's Triton chunk_kda
(FLA_FLASH_KDA=0), same inputs, one run: ms (cold L2, CUDA events, medians), speedups, % of
the memory floor; then an accuracy table against the float64 recurrent reference."""
from __future__ import annotations

import os

import numpy as np

from .. import reference
from ..ops.kda import chunk_kda
from . import timing

D = 128
LOWER_BOUND = -5.0
# (heads, lengths of the sequences, fp32 initial + final state)
SHAPES = [
    (96, [8192], True), (96, [1300, 547, 2048, 963, 271, 3063], True), (96, [1024] * 8, True),
    (64, [8192], True), (64, [1300, 547, 2048, 963, 271, 3063], True), (64, [1024] * 8, True),
    (32, [32768], True), (32, [8192], False), (8, [32768], False), (16, [65536], False),
    (8, [131072], False), (4, [262144], False),
]
FLA_SHAPES = {0}   # fla autotunes ~90 s per new shape: time it on these only


def _inputs(H, lengths, with_state, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")
    bf = torch.bfloat16
    x = dict(q=rnd(1, T, H, D).to(bf), k=rnd(1, T, H, D).to(bf), v=rnd(1, T, H, D).to(bf),
             g=rnd(1, T, H, D).to(bf), beta=rnd(1, T, H).to(bf))
    params = dict(A_log=torch.log(torch.rand(H, generator=g, device="cuda") * 15 + 1), dt_bias=0.1 * rnd(H, D))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64, device="cuda") if N > 1 else None
    h0 = 0.05 * rnd(N, H, D, D) if with_state else None
    return x, params, cu, h0


def _peers():
    os.environ["FLA_FLASH_KDA"] = "0"
    peers = {}
    try:
        import flash_kda
        peers["flashkda"] = flash_kda
    except Exception as exc:
        print(f"FlashKDA unavailable: {type(exc).__name__}: {exc}")
    try:
        from fla.ops.kda import chunk_kda as fla_chunk_kda
        peers["fla"] = fla_chunk_kda
    except Exception as exc:
        print(f"fla unavailable: {type(exc).__name__}: {exc}")
    return peers


def _runners(x, params, cu, h0, peers):
    """name -> (callable returning (out, final_state))."""
    import torch
    H = x["q"].shape[2]
    N = 1 if cu is None else cu.numel() - 1
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    fs_ours = torch.empty(N, H, D, D, device="cuda") if h0 is not None else None
    run = {"pykda": lambda: chunk_kda(*seq, **params, lower_bound=LOWER_BOUND, initial_state=h0,
                                      output_final_state=h0 is not None, final_state=fs_ours,
                                      cu_seqlens=cu)}
    if "flashkda" in peers:
        out = torch.empty_like(x["v"])
        fs = torch.empty(N, H, D, D, device="cuda") if h0 is not None else None

        def flashkda():
            peers["flashkda"].fwd(*seq, D ** -0.5, out, params["A_log"], params["dt_bias"], LOWER_BOUND,
                                  initial_state=h0, final_state=fs, cu_seqlens=cu)
            return out, fs
        run["flashkda"] = flashkda
    if "fla" in peers:
        def fla():
            return peers["fla"](*seq, scale=D ** -0.5, initial_state=h0, output_final_state=h0 is not None,
                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                use_beta_sigmoid_in_kernel=True, lower_bound=LOWER_BOUND,
                                A_log=params["A_log"], dt_bias=params["dt_bias"].flatten(),
                                state_v_first=True, cu_seqlens=cu)
        run["fla"] = fla
    return run


def run(args):
    import torch
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    peers = _peers()
    rows = []
    shapes = SHAPES[:3] if args.quick else SHAPES
    for i, (H, lengths, with_state) in enumerate(shapes):
        x, params, cu, h0 = _inputs(H, lengths, with_state)
        runners = _runners(x, params, cu, h0, peers if i in FLA_SHAPES else
                           {k: v for k, v in peers.items() if k != "fla"})
        T, N = sum(lengths), len(lengths)
        floor_bytes = 5 * T * H * D * 2 + (2 * N * H * D * D * 4 if with_state else 0)
        row = dict(H=H, T=T, N=N, state=with_state, floor_ms=floor_bytes / (copy_tbs * 1e12) * 1e3)
        for name, fn in runners.items():
            try:
                fn()
                row[name] = timer.median_us(fn, warmup=3, repeats=20) / 1e3
            except Exception as exc:
                row[name] = None
                row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
        del x, params, cu, h0, runners
        torch.cuda.empty_cache()
    accuracy = _accuracy(peers)
    _print(rows, accuracy)
    return {"timing": rows, "accuracy": accuracy}


def _accuracy(peers):
    """T = 4096, H = 8, one sequence, fp32 initial state 0.05·randn: relative L2 errors."""
    x, params, cu, h0 = _inputs(8, [4096], True, seed=1)
    f64 = lambda t: t.double().cpu().numpy()
    o_ref, s_ref = reference.kda_recurrent(*(f64(x[n]) for n in ("q", "k", "v", "g", "beta")),
                                           A_log=f64(params["A_log"]), dt_bias=f64(params["dt_bias"]),
                                           lower_bound=LOWER_BOUND, initial_state=f64(h0))
    result = {}
    for name, fn in _runners(x, params, cu, h0, peers).items():
        try:
            o, s = fn()
            result[name] = dict(out=reference.relative_error(f64(o), o_ref),
                                state=reference.relative_error(f64(s), s_ref))
        except Exception as exc:
            result[name] = dict(error=f"{type(exc).__name__}: {exc}"[:200])
    return result


def _print(rows, accuracy):
    names = ["pykda", "flashkda", "fla"]
    print(f"\n{'H':>3} {'T':>7} {'N':>2} {'state':>5} {'floor ms':>8} " +
          " ".join(f"{n + ' ms':>11}" for n in names) + f" {'x FlashKDA':>10} {'x fla':>6} {'%floor':>6}")
    for r in rows:
        cells = " ".join(f"{r[n]:11.3f}" if r.get(n) else f"{'-':>11}" for n in names)
        ours = r.get("pykda")
        ratio = lambda n: f"{r[n] / ours:.2f}" if ours and r.get(n) else "-"
        pct = f"{100 * r['floor_ms'] / ours:.0f}" if ours else "-"
        print(f"{r['H']:3d} {r['T']:7d} {r['N']:2d} {str(r['state']):>5} {r['floor_ms']:8.3f} {cells} "
              f"{ratio('flashkda'):>10} {ratio('fla'):>6} {pct:>6}")
    print("\naccuracy, T=4096 H=8, vs float64 recurrent reference (relative L2):")
    for name, a in accuracy.items():
        print(f"  {name:>9}: " + (f"out {a['out']:.2e}  final state {a['state']:.2e}" if "out" in a else a["error"]))
