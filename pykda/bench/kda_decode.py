"""`python -m pykda bench kda-decode [--quick] [--rows-per-thread 4,8] [--stages 2,3,4]`: the KDA decode step on a pool of states vs fla,
same inputs, same work: each sequence reads its pool row (picked by the index array) and writes it
back in place.

Gate modes (column "gate"), each with the same keywords for both ops: "safe" (pykda's bounded
gate `lower_bound · sigmoid(exp(A_log) · (g + dt_bias))`, lower_bound -5, β logits), "softplus"
(Kimi Linear's `-exp(A_log) · softplus(g + dt_bias)`, β logits) and "vllm" (vLLM's decode call:
its own gate kernel ran before, so g is the fp32 log-decay and beta fp32 probabilities; no A_log or
dt_bias). q and k are L2-normalised in the kernel in every mode. Every pool shape is timed with
the safe gate; the other two modes on a few rows (GATE_ROWS).

fla is called on its serving path, `fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd(...,
initial_state=pool, ssm_state_indices=idx, inplace_final_state=True)`, the forward vLLM-style
engines call. (The public `fla.ops.kda.fused_recurrent_kda` takes `ssm_state_indices` and
`inplace_final_state` into **kwargs and drops them: it reads pool rows 0..B-1 and writes no state,
half the traffic. It is used, and labelled, only where the forward cannot be imported.) Both
outputs and updated pool rows are checked against a float64 reference.

Columns: kernel µs (cold L2, CUDA events, median); host µs per call (the GPU idle at each call,
median); "graph" host µs per call when the call is captured once in a CUDA graph and replayed;
state TB/s (read + write); % of the 4 GiB copy's bandwidth and % of a copy of the same number
of bytes (cold L2: small problems cannot reach the big copy's bandwidth); "K-1st": pykda's
kernel µs on the same states in fla's K-first layout [P, H, K, V] (`state_v_first=False`,
whole-state tiles), its error checked too. Every other column is the V-first pool [P, H, V, K].

Speculative decode (a second table, column T): T tokens per sequence with 2-D state_indices
[B, T] and num_accepted_tokens (fla's and vLLM's keywords; both ops get the same call), so each
step reads one row and writes T (the state after every token): state TB/s counts those 1 + T
transfers; "x T=1" is the time over the T = 1 row's.

With `--rows-per-thread` or `--stages` it sweeps the template parameters instead: a row per
setting (kernel µs, TB/s, error), no host timing, and no peer unless `--plot` asks for the
sweep drawn (then fla's kernel µs and error once per case, in each of its rows).
"""
from __future__ import annotations

import inspect
import itertools

from .. import reference
from ..ops.kda_decode import fused_recurrent_kda
from ..ops.kda_variant import SAFE_GATE_FLAGS
from . import plot as plotting, settings, timing
from ..progress import progress

BATCHES = (1, 8, 64, 256)
HEADS = (32, 8)
POOLS = ("float32", "bfloat16")
GATES = ("safe", "softplus", "vllm")
GATE_ROWS = (("float32", 32, 1), ("float32", 32, 64), ("bfloat16", 32, 256))   # of the modes other than "safe"
QUICK = (("safe", "float32", 32, 1), ("safe", "float32", 32, 64), ("safe", "float32", 8, 256),
         ("safe", "bfloat16", 32, 64), ("softplus", "float32", 32, 64), ("vllm", "float32", 32, 64))
# speculative decode rows (gate, pool, H, B, T): vLLM's call at the issue's B 64, H 32
SPEC_QUICK = tuple(("vllm", "float32", 32, 64, t) for t in (1, 2, 4, 8)) + tuple(
    ("vllm", "bfloat16", 32, 64, t) for t in (1, 4))
SPEC_FULL = tuple((gate, pool, 32, 64, t) for gate in GATES for pool in POOLS for t in (1, 2, 4, 8))
D = 128
LOWER_BOUND = -5.0
# pykda's keywords of each gate mode (fla's names; the pool's layout is passed on its own)
FLAGS = {"safe": dict(SAFE_GATE_FLAGS._asdict(), lower_bound=LOWER_BOUND),
         "softplus": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True),
         "vllm": dict(use_qk_l2norm_in_kernel=True)}
# the float64 reference's gate and β form of each mode
REFERENCE = {"safe": dict(gate="safe", beta_form="logit", lower_bound=LOWER_BOUND),
             "softplus": dict(gate="softplus", beta_form="logit"),
             "vllm": dict(gate="none", beta_form="prob")}
SERVING = "fused_recurrent_kda_fwd"
PUBLIC = "fused_recurrent_kda (public: reads rows 0..B-1, writes no state)"
# fla's forward ends in **kwargs: a misspelt keyword would be dropped silently, so every keyword
# the bench passes must be one of its parameters.
FLA_KEYWORDS = ("A_log", "dt_bias", "initial_state", "scale", "inplace_final_state", "ssm_state_indices",
                "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "lower_bound",
                "state_v_first")


def cases(quick: bool) -> list[tuple[str, str, int, int]]:
    """(gate mode, pool dtype, heads, batch) rows."""
    if quick:
        return list(QUICK)
    return ([("safe", pool, H, B) for pool in POOLS for H in HEADS for B in BATCHES]
            + [(gate, pool, H, B) for gate in GATES[1:] for pool, H, B in GATE_ROWS])


def spec_cases(quick: bool) -> list[tuple[str, str, int, int, int]]:
    """(gate mode, pool dtype, heads, batch, tokens) rows of the speculative-decode table."""
    return list(SPEC_QUICK if quick else SPEC_FULL)


def fla_flags(gate: str) -> dict:
    """fla's keywords for a gate mode: the same values as pykda's, less `safe_gate` (fla's decode
    has no such parameter: lower_bound alone selects the bounded gate there)."""
    flags = FLAGS[gate]
    return dict({n: bool(flags.get(n, False)) for n in ("use_qk_l2norm_in_kernel", "use_gate_in_kernel",
                                                        "use_beta_sigmoid_in_kernel")},
                lower_bound=flags.get("lower_bound"))


def _inputs(B, H, pool_dtype, gate="safe", T=None):
    """q, k, v, g, beta (and A_log, dt_bias where the gate is computed in the kernel), the pool
    [2B, H, V, K] and B distinct rows of it; with T (speculative decode) T tokens, a pool of
    (T + 1)·B rows and a [B, T] table of distinct rows. For "vllm" g is the softplus gate's fp32
    log-decay and beta fp32 sigmoid(beta), as vLLM's gate kernel hands them to its decode call."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(B * H)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")   # noqa: E731
    bf = torch.bfloat16
    n = T or 1
    x = dict(q=rnd(B, n, H, D).to(bf), k=rnd(B, n, H, D).to(bf), v=rnd(B, n, H, D).to(bf),
             g=rnd(B, n, H, D).to(bf), beta=rnd(B, n, H).to(bf),
             A_log=torch.log(torch.rand(H, generator=g, device="cuda") * 15 + 1), dt_bias=0.1 * rnd(H * D))
    P = (n + 1) * B
    pool = (0.1 * rnd(P, H, D, D)).to(getattr(torch, pool_dtype))
    idx = torch.randperm(P, device="cuda")[:n * B].to(torch.int32)
    idx = idx.reshape(B, n) if T else idx
    if gate == "vllm":
        A_log, dt_bias = x.pop("A_log"), x.pop("dt_bias")
        x["g"] = -A_log.exp()[:, None] * torch.nn.functional.softplus(x["g"].float() + dt_bias.view(H, D))
        x["beta"] = torch.sigmoid(x["beta"].float())
    return x, pool, idx


def fla_peer():
    """(call(x, pool, idx, gate="safe") -> o, label, serving?) for fla, or (None, reason, False).

    The serving forward where it imports and takes every keyword the bench passes; else the
    public wrapper (not the same work: labelled)."""
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fwd
        params = inspect.signature(fwd).parameters
        missing = [n for n in FLA_KEYWORDS if n not in params]
        if missing:
            raise TypeError(f"fused_recurrent_kda_fwd has no parameter {', '.join(missing)}")
    except Exception as exc:
        fwd, why = None, f"{type(exc).__name__}: {exc}"[:200]
    if fwd is not None:
        def serving(x, pool, idx, gate="safe", accepted=None):
            spec = {}
            if accepted is not None:   # speculative decode
                if "num_accepted_tokens" not in params:
                    raise TypeError("fused_recurrent_kda_fwd has no parameter num_accepted_tokens")
                spec = dict(num_accepted_tokens=accepted)
            o, _ = fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
                       initial_state=pool, scale=D ** -0.5, inplace_final_state=True, ssm_state_indices=idx,
                       state_v_first=True, **fla_flags(gate), **spec)
            return o
        return serving, SERVING, True
    try:
        from fla.ops.kda import fused_recurrent_kda as public
    except Exception as exc:
        return None, f"fla not importable ({type(exc).__name__}: {exc})"[:200], False

    def fallback(x, pool, idx, gate="safe", accepted=None):
        o, _ = public(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
                      initial_state=pool, scale=D ** -0.5, state_v_first=True, **fla_flags(gate))
        return o
    return fallback, f"{PUBLIC}; the forward: {why}", False


def step_error(x, o, before, after, row: int | None, read_row: int, gate: str = "safe") -> float:
    """Max relative error (vs float64, gate mode `gate`) of sequence 0's output and, where `row`
    is given, of its updated pool row; `read_row` is the row its initial state was read from."""
    f64 = lambda t: t.double().cpu().numpy()   # noqa: E731
    gate_args = {n: f64(x[n]) for n in ("A_log", "dt_bias") if x.get(n) is not None}
    o_ref, s_ref = reference.kda_recurrent(
        *(f64(x[n][:1]) for n in ("q", "k", "v", "g", "beta")), **gate_args, **REFERENCE[gate],
        initial_state=f64(before[read_row:read_row + 1]))
    err = reference.relative_error(f64(o[:1]), o_ref)
    if row is not None:
        err = max(err, reference.relative_error(f64(after[row:row + 1]), s_ref))
    return err


def state_bytes(B: int, H: int, pool, T: int | None = None) -> int:
    """State traffic of one step: each of the B × H rows read and written once; with T
    (speculative decode) read once and written T times."""
    return (1 + (T or 1)) * B * H * D * D * pool.element_size()


def checked_step(x, pool, idx, fn, pool_row_written: bool = True, gate: str = "safe", accepted=None) -> float:
    """Run one step `fn` on a saved copy's worth of `pool` and return `step_error` of sequence 0
    (its output, and its pool row where the step writes it in place; with a [B, T] table the row
    of its last token, read from column accepted[0] - 1)."""
    if idx.ndim == 2:
        read, written = int(idx[0, int(accepted[0]) - 1]), int(idx[0, -1])
    else:
        read = written = int(idx[0])
    before = pool.clone()
    o = fn()
    return step_error(x, o, before, pool, written if pool_row_written else None, read if pool_row_written else 0,
                      gate)


def ours_step(x, pool, idx, gate, accepted=None, v_first=True, **kw):
    """pykda's step in gate mode `gate` on the pool (V-first, or K-first where `v_first` is
    False), in place; returns the output."""
    if accepted is not None:
        kw["num_accepted_tokens"] = accepted
    o, _ = fused_recurrent_kda(**x, **FLAGS[gate], state_v_first=v_first, initial_state=pool, state_indices=idx,
                               **kw)
    return o


def _k_first_step(row, x, pool, idx, gate, accepted, timer, repeats) -> None:
    """pykda on a K-first copy of the pool: row["kfirst_err"] (checked through the copy's V-first
    view) and row["kfirst_us"]; a failure as row["kfirst_error"]."""
    k_pool = pool.transpose(-1, -2).contiguous()   # [P, H, K, V]: the same states
    step = lambda: ours_step(x, k_pool, idx, gate, accepted, v_first=False)   # noqa: E731
    try:
        row["kfirst_err"] = checked_step(x, k_pool.transpose(-1, -2), idx, step, gate=gate, accepted=accepted)
        row["kfirst_us"] = timer.median_us(step, warmup=10, repeats=repeats)
    except Exception as exc:
        row["kfirst_error"] = f"{type(exc).__name__}: {exc}"[:200]


def _verify_step(row, x, pool, idx, gate, timer, repeats) -> None:
    """SGLang's target verify of the same tokens (each sequence from its table's first row, every
    token's state into a [B, T, H, V, K] buffer, the pool only read; the same bytes as the 2-D
    step), as a chain and as a binary tree of drafts (token t's parent (t - 1) // 2: a reload of
    the parent's state at every token past the first branch): row["verify_us"] and
    row["tree_us"], a failure as row["verify_error"] or row["tree_error"]."""
    import torch
    B, T = idx.shape
    buf = torch.empty(B, T, *pool.shape[1:], dtype=pool.dtype, device=pool.device)
    rows, slots = idx[:, 0].contiguous(), torch.arange(B, dtype=torch.int32, device=pool.device)
    tree = torch.tensor([-1] + [(t - 1) // 2 for t in range(1, T)], dtype=torch.int64, device=pool.device)
    for key, parents in (("verify", None), ("tree", tree.expand(B, T))):
        step = lambda: ours_step(x, pool, rows, gate, intermediate_states_buffer=buf,   # noqa: E731
                                 intermediate_state_indices=slots, disable_state_update=True,
                                 retrieve_parent_token=parents)
        try:
            row[f"{key}_us"] = timer.median_us(step, warmup=10, repeats=repeats)
        except Exception as exc:
            row[f"{key}_error"] = f"{type(exc).__name__}: {exc}"[:200]


def _one_row_step(row, x, pool, idx, gate, timer, repeats) -> None:
    """The same tokens with 1-D state_indices (each sequence from its table's first row, only the
    final state written back: two state transfers, issue 11's count): row["oned_us"] and
    row["oned_tbs"], a failure as row["oned_error"]."""
    rows = idx[:, 0].contiguous()
    step = lambda: ours_step(x, pool, rows, gate)   # noqa: E731
    try:
        row["oned_us"] = timer.median_us(step, warmup=10, repeats=repeats)
        row["oned_tbs"] = state_bytes(idx.shape[0], pool.shape[1], pool) / row["oned_us"] / 1e6
    except Exception as exc:
        row["oned_error"] = f"{type(exc).__name__}: {exc}"[:200]


def _measure(row, prefix, fn, timer, repeats, host_n):
    """Kernel µs, host µs and graph host µs of `fn` into row[prefix + ...]; errors as text."""
    try:
        row[prefix + "us"] = timer.median_us(fn, warmup=10, repeats=repeats)
        row[prefix + "host_us"] = timing.host_us(fn, host_n)
    except Exception as exc:
        row[prefix + "error"] = f"{type(exc).__name__}: {exc}"[:200]
        return
    try:
        row[prefix + "graph_us"] = timing.graph_host_us(fn, host_n)
    except Exception as exc:
        row[prefix + "graph_error"] = f"{type(exc).__name__}: {exc}"[:200]


def run(args):
    import torch
    quick = bool(getattr(args, "quick", False))
    repeats, host_n = (30, 100) if quick else (100, 300)
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    sweep = list(itertools.product(settings(getattr(args, "rows_per_thread", None)),
                                   settings(getattr(args, "stages", None))))
    if sweep != [(None, None)]:
        fla = fla_peer() if getattr(args, "plot", None) else None   # a plot draws fla beside the sweep
        if fla is not None:
            print(f"fla: {fla[1]}")
        rows = []
        for case in progress(timing.in_time(cases(quick), "cases"), "bench kda-decode", label=case_label, unit="case"):
            peer = _sweep_peer(*case, fla, timer, repeats) if fla is not None else {}
            for rpt, st in progress(sweep, "settings", label=_settings_label):
                rows.append(dict(_sweep_row(*case, rpt, st, timer, copy_tbs, repeats), **peer))
        _print_sweep(rows)
        return rows
    fla = fla_peer()
    print(f"fla: {fla[1]}")
    rows = []
    for gate, pool_dtype, H, B in progress(timing.in_time(cases(quick), "cases"), "bench kda-decode", label=case_label,
                                           unit="case"):
        rows.append(_case(gate, pool_dtype, H, B, fla, timer, copy_tbs, repeats, host_n))
        torch.cuda.empty_cache()
    _print(rows, fla[1])
    spec_rows = []
    for gate, pool_dtype, H, B, T in progress(timing.in_time(spec_cases(quick), "cases"), "bench kda-decode spec",
                                              label=case_label, unit="case"):
        spec_rows.append(_case(gate, pool_dtype, H, B, fla, timer, copy_tbs, repeats, host_n, T=T))
        torch.cuda.empty_cache()
    if spec_rows:
        _print_spec(spec_rows)
    return rows + spec_rows


def _case(gate, pool_dtype, H, B, fla_entry, timer, copy_tbs, repeats, host_n, T=None) -> dict:
    """One row: ours and fla on the same inputs and gate mode, each from its own copy of the pool
    (T: speculative decode of T tokens, num_accepted_tokens cycling through 1..T)."""
    import torch
    fla, fla_label, fla_serving = fla_entry
    x, pool, idx = _inputs(B, H, pool_dtype, gate, T)
    accepted = torch.arange(B, device="cuda", dtype=torch.int32) % T + 1 if T else None
    nbytes = state_bytes(B, H, pool, T)
    ours = lambda: ours_step(x, pool, idx, gate, accepted)   # noqa: E731
    row = dict(gate=gate, pool=pool_dtype, H=H, B=B, state_bytes=nbytes, fla=fla_label,
               err=checked_step(x, pool, idx, ours, gate=gate, accepted=accepted))
    if T:
        row["T"] = T
    _measure(row, "", ours, timer, repeats, host_n)
    _k_first_step(row, x, pool, idx, gate, accepted, timer, repeats)
    if T:
        _verify_step(row, x, pool, idx, gate, timer, repeats)
        _one_row_step(row, x, pool, idx, gate, timer, repeats)
    copy_us = timer.copy_us(nbytes // 2, repeats=repeats)
    row["copy_us"] = copy_us
    if row.get("us"):
        row["tbs"] = nbytes / row["us"] / 1e6
        row["pct_copy"] = 100 * row["tbs"] / copy_tbs
        row["pct_same_copy"] = 100 * copy_us / row["us"]
    if fla is not None:
        _fla_step(row, x, pool, idx, gate, fla_entry,
                  lambda theirs: _measure(row, "fla_", theirs, timer, repeats, host_n), accepted)
    return row


def _fla_step(row, x, pool, idx, gate, fla_entry, measure, accepted=None) -> None:
    """fla on its own copy of the pool: row["fla_err"] from one checked step, then `measure(step)`;
    a failure as row["fla_error"]."""
    fla, _, fla_serving = fla_entry
    fla_pool = pool.clone()
    theirs = lambda: fla(x, fla_pool, idx, gate, accepted)   # noqa: E731
    try:
        row["fla_err"] = checked_step(x, fla_pool, idx, theirs, pool_row_written=fla_serving, gate=gate,
                                      accepted=accepted)
        measure(theirs)
    except Exception as exc:
        row["fla_error"] = f"{type(exc).__name__}: {exc}"[:200]


def _sweep_peer(gate, pool_dtype, H, B, fla_entry, timer, repeats) -> dict:
    """fla's label, kernel µs and error on a case's inputs (for a sweep's plot), or why not."""
    row = dict(fla=fla_entry[1])
    if fla_entry[0] is None:
        return row
    x, pool, idx = _inputs(B, H, pool_dtype, gate)
    _fla_step(row, x, pool, idx, gate, fla_entry,
              lambda theirs: row.update(fla_us=timer.median_us(theirs, warmup=10, repeats=repeats)))
    return row


def _sweep_row(gate, pool_dtype, H, B, rpt, stages, timer, copy_tbs, repeats) -> dict:
    """One setting of the template parameters: kernel µs, TB/s and error (an error as text)."""
    x, pool, idx = _inputs(B, H, pool_dtype, gate)
    row = dict(gate=gate, pool=pool_dtype, H=H, B=B, rows_per_thread=rpt, stages=stages)
    ours = lambda: ours_step(x, pool, idx, gate, rows_per_thread=rpt, stages=stages)   # noqa: E731
    try:
        row["err"] = checked_step(x, pool, idx, ours, gate=gate)
        row["us"] = timer.median_us(ours, warmup=10, repeats=repeats)
        row["tbs"] = state_bytes(B, H, pool) / row["us"] / 1e6
        row["pct_copy"] = 100 * row["tbs"] / copy_tbs
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def _setting(value) -> str:
    return str(value) if value else "auto"


def case_label(case) -> str:
    gate, pool_dtype, H, B, *T = case
    return f"{gate} {pool_dtype} H={H} B={B}" + (f" T={T[0]}" if T else "")


def _settings_label(point) -> str:
    rpt, st = point
    return f"rows/thread {_setting(rpt)} stages {_setting(st)}"


def plot(rows, path, device=None):
    """--plot: µs and state TB/s against rows per thread / stages, one line per case, fla dashed."""
    return plotting.sweep(path, rows, ("rows_per_thread", "stages"),
                          shape=lambda r: case_label((r["gate"], r["pool"], r["H"], r["B"])),
                          peer=lambda r: ("fla", r["fla_us"]) if r.get("fla_us") else None,
                          title=f"pykda bench kda-decode (state pool in place, K=V={D})"
                                + (f", {device}" if device else ""))


def _print_sweep(rows):
    print(f"{'gate':>8} {'pool':>8} {'H':>3} {'B':>4} {'rpt':>4} {'stages':>6} {'us':>7} {'TB/s':>5} {'%copy':>5} "
          f"{'err':>7}")
    for r in rows:
        g = r.get
        print(f"{r['gate']:>8} {r['pool']:>8} {r['H']:3d} {r['B']:4d} {_setting(r['rows_per_thread']):>4} "
              f"{_setting(r['stages']):>6} "
              f"{_cell(g('us'), '.1f', 7)} {_cell(g('tbs'), '.2f', 5)} {_cell(g('pct_copy'), '.0f', 5)} "
              f"{_cell(g('err'), '.1e', 7)} {g('error', '')}")


def _cell(value, fmt, width):
    return f"{value:{width}{fmt}}" if value is not None else f"{'-':>{width}}"


def _print_spec(rows):
    """The speculative-decode table: a row per T, its time over the T = 1 row's of the same case."""
    print("\nspeculative decode: [B, T] state_indices + num_accepted_tokens, a state row written per token")
    print(f"{'gate':>8} {'pool':>8} {'H':>3} {'B':>4} {'T':>2} {'us':>7} {'x T=1':>6} {'TB/s':>5} {'err':>7} "
          f"{'K-1st':>7} {'verify':>7} {'tree':>7} {'1-D':>7} {'TB/s':>5} | {'fla us':>7} {'err':>7} {'x fla':>6}")
    one = {(r["gate"], r["pool"], r["H"], r["B"]): r.get("us") for r in rows if r["T"] == 1}
    for r in rows:
        g = r.get
        base = one.get((r["gate"], r["pool"], r["H"], r["B"]))
        slower = g("us") / base if g("us") and base else None
        ratio = g("fla_us") / g("us") if g("fla_us") and g("us") else None
        print(f"{r['gate']:>8} {r['pool']:>8} {r['H']:3d} {r['B']:4d} {r['T']:2d} {_cell(g('us'), '.1f', 7)} "
              f"{_cell(slower, '.2f', 6)} {_cell(g('tbs'), '.2f', 5)} {_cell(g('err'), '.1e', 7)} "
              f"{_cell(g('kfirst_us'), '.1f', 7)} {_cell(g('verify_us'), '.1f', 7)} {_cell(g('tree_us'), '.1f', 7)} "
              f"{_cell(g('oned_us'), '.1f', 7)} "
              f"{_cell(g('oned_tbs'), '.2f', 5)} | "
              f"{_cell(g('fla_us'), '.1f', 7)} {_cell(g('fla_err'), '.1e', 7)} {_cell(ratio, '.2f', 6)}")
    for r in rows:
        for k, v in r.items():
            if k.endswith("error"):
                print(f"  {case_label((r['gate'], r['pool'], r['H'], r['B'], r['T']))} {k}: {v}")
    print("TB/s: state bytes moved (one read, T writes) over the kernel time; verify: kernel µs of SGLang's target "
          "verify of the same tokens (1-D rows, each token's state into a buffer, the pool only read); tree: the same "
          "as a binary tree of drafts (token t's parent (t - 1) // 2, retrieve_parent_token); 1-D: the same "
          "tokens with 1-D rows, the final state written once, and its TB/s of those two transfers")


def _print(rows, fla_label):
    print(f"\nfla: {fla_label}")
    print(f"{'gate':>8} {'pool':>8} {'H':>3} {'B':>4} {'us':>7} {'host':>6} {'graph':>6} {'TB/s':>5} {'%copy':>5} "
          f"{'%same':>5} {'err':>7} {'K-1st':>7} | {'fla us':>7} {'host':>6} {'graph':>6} {'err':>7} {'x fla':>6}")
    for r in rows:
        g = r.get
        ratio = g("fla_us") / g("us") if g("fla_us") and g("us") else None
        print(f"{r['gate']:>8} {r['pool']:>8} {r['H']:3d} {r['B']:4d} {_cell(g('us'), '.1f', 7)} "
              f"{_cell(g('host_us'), '.1f', 6)} "
              f"{_cell(g('graph_us'), '.1f', 6)} {_cell(g('tbs'), '.2f', 5)} {_cell(g('pct_copy'), '.0f', 5)} "
              f"{_cell(g('pct_same_copy'), '.0f', 5)} {_cell(g('err'), '.1e', 7)} {_cell(g('kfirst_us'), '.1f', 7)} | "
              f"{_cell(g('fla_us'), '.1f', 7)} "
              f"{_cell(g('fla_host_us'), '.1f', 6)} {_cell(g('fla_graph_us'), '.1f', 6)} "
              f"{_cell(g('fla_err'), '.1e', 7)} {_cell(ratio, '.2f', 6)}")
    errors = [(r["gate"], r["pool"], r["H"], r["B"], k, v) for r in rows for k, v in r.items() if k.endswith("error")]
    for gate, pool, H, B, k, v in errors:
        print(f"  {gate} {pool} H={H} B={B} {k}: {v}")
    print("gate: safe = lower_bound -5 sigmoid gate, softplus = Kimi Linear's, vllm = g precomputed (fp32 log-decay), "
          "fp32 beta probabilities")
    print("us: kernel (cold L2); host/graph: host µs per call, plain and as a CUDA-graph replay; "
          "%copy: of the 4 GiB copy's TB/s; %same: of a copy of the same bytes; K-1st: kernel µs on fla's "
          "K-first layout")
