"""`python -m pykda bench kda`: KDA prefill (chunk_kda) vs FlashKDA and fla's Triton chunk_kda
(FLA_FLASH_KDA=0), same inputs, one run: ms (cold L2, CUDA events, medians), speedups, % of
the memory floor; then an accuracy table against the float64 recurrent reference.

Gate modes (column "gate"), q/k L2-normalised and β = sigmoid(beta) in the kernels in both:
"softplus" is Kimi Linear's `-exp(A_log) · softplus(g + dt_bias)` (use_gate_in_kernel=True, no
lower_bound); "safe" is `lower_bound · sigmoid(exp(A_log) · (g + dt_bias))` with lower_bound -5
(safe_gate=True). pykda runs every shape in both; FlashKDA only has the bounded gate (its
softplus cells say so); fla is timed with the softplus gate, on FLA_SHAPES. States are V-first
[N, H, V, K] fp32 for every op (`state_v_first=True`).

Rows with a long sequence also time pykda's serial chunk chain ("serial": `segment_chunks=0`)
beside its planned call, which splits such sequences into segments (column "x serial": the gain).
Varlen calls pass `cu_seqlens_cpu` (to pykda and fla), as fla's callers do: pykda plans its
segments with it.

The "pool" row repeats one shape (POOL_SHAPE) with the states read from and written back into
rows of a pool larger than N (`initial_state=pool, state_indices=idx`), beside the contiguous
`initial_state` call of the same shape timed in the same row.

With `--chunk-size`, `--warps`, `--stages` or `--segment-chunks` it sweeps the planner's settings
instead (the kernels' CHUNK, the recurrence's consumer warps, its pipeline depth, chunks per segment): pykda
alone, a row per shape, gate mode and setting, the planner's own choice ("auto") first and each
row's time against it ("x auto")."""
from __future__ import annotations

import itertools
import os
import re
from typing import Callable, NamedTuple

import numpy as np

from .. import reference
from ..ops.kda import chunk_kda
from ..ops.kda_variant import SAFE_GATE_FLAGS
from . import settings, timing
from ..progress import progress

D = 128
LOWER_BOUND = -5.0
# (heads, lengths of the sequences, fp32 initial + final state)
SHAPES = [
    (96, [8192], True), (96, [1300, 547, 2048, 963, 271, 3063], True), (96, [1024] * 8, True),
    (64, [8192], True), (64, [1300, 547, 2048, 963, 271, 3063], True), (64, [1024] * 8, True),
    (32, [32768], True), (32, [8192], False), (8, [32768], False), (16, [65536], False),
    (8, [131072], False), (4, [262144], False), (1, [1048576], False), (8, [131072] + [1024] * 63, False),
]
SERIAL_FROM = 32768   # rows with a sequence this long also time pykda's serial path (segment_chunks=0)
FLA_SHAPES = {0}   # fla autotunes ~90 s per new shape: time it on these only
GATES = ("softplus", "safe")
# chunk_kda's keywords of each gate mode (fla's names)
FLAGS = {"softplus": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True),
         "safe": dict(SAFE_GATE_FLAGS._asdict(), lower_bound=LOWER_BOUND)}
# the float64 reference's gate of each mode
REFERENCE = {"softplus": dict(gate="softplus"), "safe": dict(gate="safe", lower_bound=LOWER_BOUND)}
PEER_GATES = {"flashkda": ("safe",), "fla": ("softplus",)}   # the gate modes each peer is run with
UNBOUNDED = "cannot run (unbounded gate)"
POOL_SHAPE = (64, [1300, 547, 2048, 963, 271, 3063])   # the "pool in place" row (run in --quick too)
POOL_ROWS_PER_SEQUENCE = 8                             # the pool holds 8 N rows
POOL_GATE = "softplus"
KNOBS = ("chunk_size", "warps", "stages", "segment_chunks")   # the chunk_kda settings a sweep can take


def parse_shapes(text: str) -> list:
    """`H:LENGTHS` rows, comma separated, the lengths joined by `+` (`LENxN`: N sequences of LEN):
    (H, lengths, no state) rows as SHAPES'."""
    rows = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+):(\d+(?:x\d+)?(?:\+\d+(?:x\d+)?)*)", item.strip())
        if m is None:
            raise ValueError(f"--shapes: {item!r} is not H:LENGTHS (e.g. 4:262144 or 8:131072+1024x63)")
        lengths = []
        for part in m.group(2).split("+"):
            length, _, count = part.partition("x")
            lengths += [int(length)] * int(count or 1)
        if int(m.group(1)) < 1 or sum(lengths) < 1:
            raise ValueError(f"--shapes: {item!r} needs H >= 1 and at least one token")
        rows.append((int(m.group(1)), lengths, False))
    return rows


def _inputs(H, lengths, with_state, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")
    bf = torch.bfloat16
    x = dict(q=rnd(1, T, H, D).to(bf), k=rnd(1, T, H, D).to(bf), v=rnd(1, T, H, D).to(bf),
             g=rnd(1, T, H, D).to(bf), beta=rnd(1, T, H).to(bf))
    # A_log and dt_bias as Kimi Linear (Mamba2's init) starts them: exp(A_log) in [1, 16], dt_bias the
    # inverse softplus of dt, log-uniform in [1e-3, 0.1]. With randn g, most chunks' decays then stay
    # above 2^-120 (kda_prepare's growth-factor form); tests/ and docs/PERFLOG.md cover steeper gates.
    dt = torch.exp(torch.empty(H, D, device="cuda").uniform_(np.log(1e-3), np.log(0.1), generator=g))
    params = dict(A_log=torch.log(torch.rand(H, generator=g, device="cuda") * 15 + 1), dt_bias=torch.log(torch.expm1(dt)))
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


def _runners(x, params, cu, h0, peers, gate="softplus", serial=False):
    """name -> (callable returning (out, final_state)) in gate mode `gate`; a peer that does
    not run that mode is left out; with `serial` also pykda without segments."""
    import torch
    H = x["q"].shape[2]
    N = 1 if cu is None else cu.numel() - 1
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    fs_ours = torch.empty(N, H, D, D, device="cuda") if h0 is not None else None
    cu_cpu = cu.cpu() if cu is not None else None   # the host copy fla's callers pass: pykda plans with it
    ours = lambda **kw: chunk_kda(*seq, **params, **FLAGS[gate], state_v_first=True, initial_state=h0,  # noqa: E731
                                  output_final_state=h0 is not None, final_state=fs_ours, cu_seqlens=cu,
                                  cu_seqlens_cpu=cu_cpu, **kw)
    run = {"pykda": ours}
    if serial:
        run["serial"] = lambda: ours(segment_chunks=0)
    if "flashkda" in peers and gate in PEER_GATES["flashkda"]:
        out = torch.empty_like(x["v"])
        fs = torch.empty(N, H, D, D, device="cuda") if h0 is not None else None

        def flashkda():
            peers["flashkda"].fwd(*seq, D ** -0.5, out, params["A_log"], params["dt_bias"], LOWER_BOUND,
                                  initial_state=h0, final_state=fs, cu_seqlens=cu)
            return out, fs
        run["flashkda"] = flashkda
    if "fla" in peers and gate in PEER_GATES["fla"]:
        def fla():
            return peers["fla"](*seq, scale=D ** -0.5, initial_state=h0, output_final_state=h0 is not None,
                                **FLAGS[gate], A_log=params["A_log"], dt_bias=params["dt_bias"].flatten(),
                                state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
        run["fla"] = fla
    return run


def _time(row, name, fn, timer):
    """row[name] = median ms of fn (cold L2); an exception as row[name + "_error"]."""
    try:
        fn()
        row[name] = timer.median_us(fn, warmup=3, repeats=20) / 1e3
    except Exception as exc:
        row[name] = None
        row[name + "_error"] = f"{type(exc).__name__}: {exc}"[:200]


def _sweep_points(args) -> list:
    """The settings of a sweep as {knob: value} (KNOBS), the planner's (all None) first; [] without
    sweep options."""
    values = [settings(getattr(args, knob, None), zero=0 if knob == "segment_chunks" else None) for knob in KNOBS]
    points = [dict(zip(KNOBS, p)) for p in itertools.product(*values)]
    auto = dict.fromkeys(KNOBS)
    return [] if points == [auto] else [auto] + [p for p in points if p != auto]


def run(args):
    import torch
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    custom = getattr(args, "shapes", None)
    shapes = parse_shapes(custom) if custom else SHAPES[:3] if args.quick else SHAPES
    points = _sweep_points(args)
    if points:
        return _sweep(shapes, points, timer, copy_tbs)
    peers = _peers()
    rows = []
    fla_rows = set() if custom else FLA_SHAPES   # (fla's autotune: only where asked for by default)
    if args.quick and not custom:
        shapes = shapes + [(H, lengths, True) for H, lengths in [POOL_SHAPE]]
    for i, (H, lengths, with_state) in progress(timing.in_time(enumerate(shapes)), "bench kda", label=_label,
                                                unit="shape"):
        x, params, cu, h0 = _inputs(H, lengths, with_state)
        T, N = sum(lengths), len(lengths)
        floor_ms = _floor_ms(H, lengths, with_state, copy_tbs)
        for gate in GATES:
            timed = {k: v for k, v in peers.items() if k != "fla" or i in fla_rows}
            row = dict(H=H, T=T, N=N, state=with_state, gate=gate, floor_ms=floor_ms)
            if "flashkda" in peers and gate not in PEER_GATES["flashkda"]:
                row["flashkda"], row["flashkda_error"] = None, UNBOUNDED
            for name, fn in _runners(x, params, cu, h0, timed, gate, serial=max(lengths) >= SERIAL_FROM).items():
                _time(row, name, fn, timer)
            rows.append(row)
        if (H, lengths) == POOL_SHAPE and with_state:
            rows.append(_pool_row(x, params, cu, h0, timer, floor_ms))
        del x, params, cu, h0
        torch.cuda.empty_cache()
    accuracy = _accuracy(peers)
    host = _host_row()
    _print(rows, accuracy, host)
    return {"timing": rows, "accuracy": accuracy, "host": host}


def _floor_ms(H, lengths, with_state, copy_tbs) -> float:
    """The memory floor: q, k, v, g and o once (bf16), the states read and written (fp32)."""
    T, N = sum(lengths), len(lengths)
    return (5 * T * H * D * 2 + (2 * N * H * D * D * 4 if with_state else 0)) / (copy_tbs * 1e12) * 1e3


def _sweep(shapes, points, timer, copy_tbs) -> dict:
    """pykda's ms at each point (KNOBS) of every shape and gate mode."""
    import torch
    rows = []
    for H, lengths, with_state in progress(timing.in_time(shapes), "bench kda sweep", label=lambda s: _label((0, s)),
                                           unit="shape"):
        x, params, cu, h0 = _inputs(H, lengths, with_state)
        for gate in GATES:
            ours = _runners(x, params, cu, h0, {}, gate)["pykda"]
            for point in points:
                row = dict(H=H, T=sum(lengths), N=len(lengths), state=with_state, gate=gate,
                           floor_ms=_floor_ms(H, lengths, with_state, copy_tbs), **point)
                # the planner's own choice of a knob is its keyword left out
                _time(row, "pykda", lambda: ours(**{k: v for k, v in point.items() if v is not None}), timer)
                rows.append(row)
        del x, params, cu, h0
        torch.cuda.empty_cache()
    _print_sweep(rows)
    return {"timing": rows}


def _print_sweep(rows):
    auto = lambda v: "auto" if v is None else str(v)   # noqa: E731
    heads = dict(chunk_size="chunk", warps="warps", stages="stages", segment_chunks="seg")
    print(f"\n{'H':>3} {'T':>7} {'N':>2} {'gate':>8} " + " ".join(f"{heads[k]:>6}" for k in KNOBS) +
          f" {'ms':>8} {'x auto':>6} {'%floor':>6}")
    base = {}
    for r in rows:
        key = (r["H"], r["T"], r["N"], r["gate"])
        ms = r.get("pykda")
        if all(r[k] is None for k in KNOBS):
            base[key] = ms
        ratio = f"{base[key] / ms:.2f}" if ms and base.get(key) else "-"
        cell, pct = (f"{ms:.3f}", f"{100 * r['floor_ms'] / ms:.0f}") if ms else ("-", "-")
        print(f"{r['H']:3d} {r['T']:7d} {r['N']:2d} {r['gate']:>8} " + " ".join(f"{auto(r[k]):>6}" for k in KNOBS) +
              f" {cell:>8} {ratio:>6} {pct:>6}")
    for r in rows:
        if r.get("pykda_error"):
            print(f"  H={r['H']} T={r['T']} {r['gate']} " + " ".join(f"{k}={auto(r[k])}" for k in KNOBS) +
                  f": {r['pykda_error']}")


def _label(item) -> str:
    _, (H, lengths, _) = item
    return f"H={H} T={sum(lengths)} N={len(lengths)}"


def _pool_row(x, params, cu, h0, timer, floor_ms, gate=POOL_GATE) -> dict:
    """chunk_kda with the states in rows of a pool of 8 N rows (`initial_state=pool,
    state_indices=idx`, final states written back into those rows) vs the contiguous call
    (`initial_state=h0`, `final_state=` a buffer of its own): same inputs, same state bytes
    read and written, both timed here. One pooled call is checked against the contiguous
    call first (outputs, the updated rows, the rows of no sequence untouched)."""
    import torch
    N, H = h0.shape[:2]
    T = x["q"].shape[1]
    P = POOL_ROWS_PER_SEQUENCE * N
    g = torch.Generator(device="cuda").manual_seed(2)
    idx = torch.randperm(P, generator=g, device="cuda")[:N].to(torch.int32)
    rows = idx.long()
    pool = 0.05 * torch.randn(P, H, D, D, generator=g, device="cuda")
    pool[rows] = h0
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    flags = dict(FLAGS[gate], state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu() if cu is not None else None,
                 **params)
    fs = torch.empty_like(h0)
    contiguous = lambda: chunk_kda(*seq, **flags, initial_state=h0, final_state=fs)   # noqa: E731
    pooled = lambda: chunk_kda(*seq, **flags, initial_state=pool, state_indices=idx)   # noqa: E731
    row = dict(H=H, T=T, N=N, state="pool", gate=gate, floor_ms=floor_ms, pool_rows=P)
    try:
        before = pool.clone()
        o_c, s_c = contiguous()
        o_p, returned = pooled()
        f64 = lambda t: t.double().cpu().numpy()   # noqa: E731
        others = torch.ones(P, dtype=torch.bool, device="cuda")
        others[rows] = False
        row.update(out_diff=reference.relative_error(f64(o_p), f64(o_c)),
                   state_diff=reference.relative_error(f64(pool[rows]), f64(s_c)),
                   others_untouched=bool(torch.equal(pool[others], before[others])),
                   final_none=returned is None)   # (o, None) without output_final_state
    except Exception as exc:
        row["check_error"] = f"{type(exc).__name__}: {exc}"[:200]
    _time(row, "contiguous", contiguous, timer)
    _time(row, "pykda", pooled, timer)
    return row


HOST_SHAPE = (32, [200, 50, 1, 261])   # a chunked-prefill step: 4 packed sequences, the state pool


class HostCall(NamedTuple):
    """The host row's chunk_kda call (`call()`, nothing to pass) and what it reads."""
    call: Callable[[], tuple]
    seq: list          # q, k, v, g, beta
    params: dict       # A_log, dt_bias
    flags: dict        # Kimi Linear's gate (FLAGS["softplus"])
    cu: object
    cu_cpu: object
    pool: object
    idx: object


def host_call() -> HostCall:
    """A small serving step's chunk_kda call (HOST_SHAPE, torch tensors, the pool, Kimi Linear's
    gate): what `bench kda`'s host row times (and docs/studies/kda_host piece by piece)."""
    import torch
    H, lengths = HOST_SHAPE
    x, params, cu, _ = _inputs(H, lengths, False)
    N = len(lengths)
    pool = torch.zeros(2 * N, H, D, D, device="cuda")
    idx = torch.arange(N, dtype=torch.int32, device="cuda")
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    cu_cpu = cu.cpu()
    flags = dict(FLAGS["softplus"])
    call = lambda: chunk_kda(*seq, **params, **flags, state_v_first=True, cu_seqlens=cu,  # noqa: E731
                             cu_seqlens_cpu=cu_cpu, initial_state=pool, state_indices=idx)
    return HostCall(call, seq, params, flags, cu, cu_cpu, pool, idx)


def _host_row() -> dict:
    """Host µs per chunk_kda call of `host_call`: with the GPU idle at each call, back to back behind
    GPU work, and as a CUDA-graph replay."""
    H, lengths = HOST_SHAPE
    call = host_call().call
    row = dict(H=H, T=sum(lengths), N=len(lengths))
    try:
        row["host_us"] = timing.host_us(call)
        row["busy_us"] = timing.busy_host_us(call)
        row["graph_us"] = timing.graph_host_us(call)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def _accuracy(peers):
    """T = 4096, H = 8, one sequence, fp32 initial state 0.05·randn: relative L2 errors per gate
    mode and op (an op that cannot run a mode: its reason)."""
    x, params, cu, h0 = _inputs(8, [4096], True, seed=1)
    f64 = lambda t: t.double().cpu().numpy()
    result = {}
    for gate in GATES:
        o_ref, s_ref = reference.kda_recurrent(*(f64(x[n]) for n in ("q", "k", "v", "g", "beta")),
                                               A_log=f64(params["A_log"]), dt_bias=f64(params["dt_bias"]),
                                               initial_state=f64(h0), **REFERENCE[gate])
        result[gate] = {}
        for name, fn in _runners(x, params, cu, h0, peers, gate).items():
            try:
                o, s = fn()
                result[gate][name] = dict(out=reference.relative_error(f64(o), o_ref),
                                          state=reference.relative_error(f64(s), s_ref))
            except Exception as exc:
                result[gate][name] = dict(error=f"{type(exc).__name__}: {exc}"[:200])
        if "flashkda" in peers and gate not in PEER_GATES["flashkda"]:
            result[gate]["flashkda"] = dict(error=UNBOUNDED)
    return result


NAMES = ("pykda", "serial", "flashkda", "fla")
WIDTHS = {"pykda": 9, "serial": 9, "flashkda": len(UNBOUNDED), "fla": 9}


def _cell(r, name) -> str:
    """A peer's ms, or why it did not run the row's gate, or '-'."""
    width = WIDTHS[name]
    if r.get(name):
        return f"{r[name]:{width}.3f}"
    return f"{UNBOUNDED if r.get(name + '_error') == UNBOUNDED else '-':>{width}}"


def _print(rows, accuracy, host):
    print(f"\n{'H':>3} {'T':>7} {'N':>2} {'state':>5} {'gate':>8} {'floor ms':>8} " +
          " ".join(f"{n + ' ms':>{WIDTHS[n]}}" for n in NAMES) +
          f" {'x serial':>8} {'x FlashKDA':>10} {'x fla':>6} {'%floor':>6}")
    for r in rows:
        ours = r.get("pykda")
        ratio = lambda n: f"{r[n] / ours:.2f}" if ours and r.get(n) else "-"
        pct = f"{100 * r['floor_ms'] / ours:.0f}" if ours else "-"
        print(f"{r['H']:3d} {r['T']:7d} {r['N']:2d} {str(r['state']):>5} {r['gate']:>8} {r['floor_ms']:8.3f} "
              f"{' '.join(_cell(r, n) for n in NAMES)} {ratio('serial'):>8} {ratio('flashkda'):>10} {ratio('fla'):>6} "
              f"{pct:>6}")
    for r in rows:
        if r["state"] == "pool":
            ratio = f"{r['pykda'] / r['contiguous']:.2f}" if r.get("pykda") and r.get("contiguous") else "-"
            ms = lambda v: f"{v:.3f}" if v else "-"   # noqa: E731
            check = (f"out diff {r['out_diff']:.1e}, state diff {r['state_diff']:.1e}, other rows "
                     f"{'untouched' if r['others_untouched'] else 'CHANGED'}") if "out_diff" in r else r.get("check_error")
            print(f"\npool in place (H={r['H']} T={r['T']} N={r['N']}, {r['gate']} gate, pool of {r['pool_rows']} rows): "
                  f"{ms(r.get('pykda'))} ms vs contiguous initial_state {ms(r.get('contiguous'))} ms (x{ratio}); "
                  f"vs the contiguous call: {check}")
    errors = [(r, k, v) for r in rows for k, v in r.items() if k.endswith("_error") and v != UNBOUNDED]
    for r, k, v in errors:
        print(f"  H={r['H']} T={r['T']} N={r['N']} {r['gate']} {k}: {v}")
    print("gate: softplus = Kimi Linear's -exp(A_log)·softplus(g + dt_bias); safe = -5·sigmoid(exp(A_log)·(g + dt_bias))")
    where = f"H={host['H']} T={host['T']} N={host['N']}, the pool, softplus gate"
    print(f"host: chunk_kda ({where}): " + (f"{host['host_us']:.1f} µs per call with the GPU idle, "
                                             f"{host['busy_us']:.1f} back to back behind GPU work, "
                                             f"{host['graph_us']:.1f} per CUDA-graph replay" if "host_us" in host
                                             else host["error"]))
    for gate, ops in accuracy.items():
        print(f"\naccuracy, {gate} gate, T=4096 H=8, vs float64 recurrent reference (relative L2):")
        for name, a in ops.items():
            print(f"  {name:>9}: " + (f"out {a['out']:.2e}  final state {a['state']:.2e}" if "out" in a else a["error"]))
