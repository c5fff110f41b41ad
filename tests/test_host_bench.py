"""CPU tests of `bench kda-decode`'s and `bench kda`'s plumbing: which fla entry point it calls and how, the
correctness check it applies to both, the case list and the table (no GPU needed)."""
import sys
import types

import numpy as np
import pytest

from pykda import reference
from pykda.bench import kda_decode as bench

torch = pytest.importorskip("torch")


def _serving_fwd(calls):
    """A stand-in with the signature of fla 0.6's fused_recurrent_kda_fwd."""
    def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                output_final_state=False, inplace_final_state=True, state_v_first=False,
                                cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                                out=None, **kwargs):
        calls.append(dict(locals()))
        return torch.zeros_like(v), initial_state
    return fused_recurrent_kda_fwd


def _public(calls):
    def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                            output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                            state_v_first=False, cu_seqlens=None, **kwargs):
        calls.append(dict(locals()))
        return torch.zeros_like(v), None
    return fused_recurrent_kda


@pytest.fixture
def fake_fla(monkeypatch):
    """Install a fake `fla` package; returns (serving calls, public calls, set_fwd)."""
    serving, public = [], []
    mods = {name: types.ModuleType(name) for name in ("fla", "fla.ops", "fla.ops.kda", "fla.ops.kda.fused_recurrent")}
    mods["fla.ops.kda"].fused_recurrent_kda = _public(public)
    mods["fla.ops.kda.fused_recurrent"].fused_recurrent_kda_fwd = _serving_fwd(serving)
    mods["fla"].ops, mods["fla.ops"].kda = mods["fla.ops"], mods["fla.ops.kda"]
    mods["fla.ops.kda"].fused_recurrent = mods["fla.ops.kda.fused_recurrent"]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return serving, public, mods


def _x(B=2, H=2, K=8):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    return dict(q=rnd(B, 1, H, K), k=rnd(B, 1, H, K), v=rnd(B, 1, H, K), g=rnd(B, 1, H, K), beta=rnd(B, 1, H),
                A_log=rnd(H), dt_bias=rnd(H * K))


def test_fla_is_called_on_its_serving_path(fake_fla):
    serving, public, _ = fake_fla
    call, label, is_serving = bench.fla_peer()
    assert label == bench.SERVING and is_serving
    x, pool, idx = _x(), torch.zeros(4, 2, 8, 8), torch.tensor([3, 1], dtype=torch.int32)
    call(x, pool, idx)
    (c,) = serving
    assert not public
    assert c["initial_state"] is pool and c["ssm_state_indices"] is idx
    assert c["inplace_final_state"] is True and c["state_v_first"] is True
    assert c["use_qk_l2norm_in_kernel"] and c["use_gate_in_kernel"] and c["use_beta_sigmoid_in_kernel"]
    assert c["lower_bound"] == bench.LOWER_BOUND and c["scale"] == bench.D ** -0.5
    assert c["A_log"] is x["A_log"] and c["dt_bias"] is x["dt_bias"]
    assert c["kwargs"] == {}   # nothing swallowed


@pytest.mark.parametrize("gate, expected", [
    ("safe", dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, A_log=True)),
    ("softplus", dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=None, A_log=True)),
    ("vllm", dict(use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, lower_bound=None, A_log=False)),
])
def test_fla_gets_each_gate_modes_keywords(fake_fla, gate, expected):
    """fla is called with the keywords of the row's gate mode (the same as pykda's, less
    safe_gate, which its decode forward does not take)."""
    serving, _, _ = fake_fla
    call, _, _ = bench.fla_peer()
    x = _x()
    if not expected["A_log"]:
        del x["A_log"], x["dt_bias"]
    call(x, torch.zeros(4, 2, 8, 8), torch.tensor([3, 1], dtype=torch.int32), gate)
    (c,) = serving
    for name in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "lower_bound"):
        assert c[name] == expected[name], name
    assert c["use_qk_l2norm_in_kernel"] is True and c["kwargs"] == {}
    assert (c["A_log"] is not None) == expected["A_log"] and (c["dt_bias"] is not None) == expected["A_log"]
    ours = {k: v for k, v in bench.FLAGS[gate].items() if k != "safe_gate"}
    assert {k: v for k, v in bench.fla_flags(gate).items() if v or k in ours} == \
        {k: v for k, v in ours.items() if k != "allow_neg_eigval" or v}


def test_fla_falls_back_to_the_public_wrapper_labelled(fake_fla, monkeypatch):
    serving, public, mods = fake_fla
    monkeypatch.delattr(mods["fla.ops.kda.fused_recurrent"], "fused_recurrent_kda_fwd")
    call, label, is_serving = bench.fla_peer()
    assert not is_serving and label.startswith(bench.PUBLIC) and "ImportError" in label
    call(_x(), torch.zeros(4, 2, 8, 8), torch.tensor([3, 1]))
    assert len(public) == 1 and not serving and public[0]["kwargs"] == {}


def test_fla_forward_missing_a_keyword_is_not_used(fake_fla, monkeypatch):
    def fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None, **kwargs):
        raise AssertionError("called")
    monkeypatch.setattr(fake_fla[2]["fla.ops.kda.fused_recurrent"], "fused_recurrent_kda_fwd", fwd)
    _, label, is_serving = bench.fla_peer()
    assert not is_serving and "no parameter inplace_final_state" in label


def test_no_fla(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)
    call, label, is_serving = bench.fla_peer()
    assert call is None and not is_serving and label.startswith("fla not importable")


def test_step_error_checks_output_and_the_updated_row():
    x = _x(B=2, H=2, K=8)
    before = 0.1 * torch.randn(4, 2, 8, 8, dtype=torch.float64)
    f64 = lambda t: t.double().numpy()   # noqa: E731
    o_ref, s_ref = reference.kda_recurrent(*(f64(x[n][:1]) for n in ("q", "k", "v", "g", "beta")),
                                           A_log=f64(x["A_log"]), dt_bias=f64(x["dt_bias"]),
                                           lower_bound=bench.LOWER_BOUND, initial_state=f64(before[3:4]))
    after = before.clone()
    after[3] = torch.from_numpy(s_ref[0])
    o = torch.zeros(2, 1, 2, 8, dtype=torch.float64)
    o[:1] = torch.from_numpy(o_ref)
    assert bench.step_error(x, o, before, after, 3, 3) < 1e-12
    assert bench.step_error(x, o, before, before, 3, 3) > 1e-3    # the row was not updated
    assert bench.step_error(x, o, before, before, None, 3) < 1e-12  # output only
    assert bench.step_error(x, o, before, after, 3, 2) > 1e-3     # read from another row
    assert bench.step_error(x, o, before, after, 3, 3, "softplus") > 1e-3   # checked against the row's gate


@pytest.mark.parametrize("gate", ["softplus", "vllm"])
def test_step_error_follows_the_gate_mode(gate):
    x = _x(B=2, H=2, K=8)
    if gate == "vllm":   # g the log-decay, beta probabilities; no A_log or dt_bias
        A_log, dt_bias = x.pop("A_log"), x.pop("dt_bias")
        x["g"] = -A_log.exp()[:, None] * torch.nn.functional.softplus(x["g"] + dt_bias.view(2, 8))
        x["beta"] = torch.sigmoid(x["beta"])
    before = 0.1 * torch.randn(4, 2, 8, 8, dtype=torch.float64)
    after = before.clone()
    o = _reference_step(x, after, torch.tensor([3, 1]), gate, dtype=torch.float64)
    assert bench.step_error(x, o, before, after, 3, 3, gate) < 1e-12
    assert bench.step_error(x, o, before, after, 3, 3, "safe") > 1e-3


def test_cases_and_table(capsys):
    full = bench.cases(False)
    safe = [c for c in full if c[0] == "safe"]
    assert len(safe) == len(bench.POOLS) * len(bench.HEADS) * len(bench.BATCHES)
    assert {c[0] for c in full} == set(bench.GATES) == {"safe", "softplus", "vllm"}
    assert len(full) - len(safe) == 2 * len(bench.GATE_ROWS) <= 8, "a modest number of rows for the other gates"
    quick = bench.cases(True)
    assert set(quick) <= set(full) and {c[0] for c in quick} == set(bench.GATES)
    spec = bench.spec_cases(False)
    assert set(bench.spec_cases(True)) <= set(spec) and {c[4] for c in spec} == {1, 2, 4, 8}
    assert {c[0] for c in spec} == set(bench.GATES) and all(c[2:4] == (32, 64) for c in spec), "the issue's B 64 H 32"
    rows = [dict(gate="safe", pool="float32", H=32, B=1, us=7.3, host_us=20.0, graph_us=3.1, tbs=0.58, pct_copy=14.0,
                 pct_same_copy=60.0, err=1e-3, fla_us=9.7, fla_host_us=90.0, fla_graph_us=3.0, fla_err=2e-3),
            dict(gate="softplus", pool="bfloat16", H=8, B=256, us=None, err=2e-3, fla_error="RuntimeError: x")]
    bench._print(rows, bench.SERVING)
    out = capsys.readouterr().out
    assert "1.33" in out and "60" in out and "softplus bfloat16 H=8 B=256 fla_error: RuntimeError: x" in out
    lines = out.splitlines()
    assert lines[2].split()[0] == "gate" and lines[3].split()[0] == "safe"   # the gate column


def reference_mode(flags: dict) -> str:
    """The gate mode that fla-style keywords ask for, read as the ops read them."""
    if not flags.get("use_gate_in_kernel"):
        assert not flags.get("use_beta_sigmoid_in_kernel"), "vllm's form: beta probabilities"
        return "vllm"
    assert flags.get("use_beta_sigmoid_in_kernel")
    return "safe" if flags.get("lower_bound") is not None else "softplus"


def _reference_step(x, pool, idx, gate="safe", dtype=torch.bfloat16):
    """What both ops do, in float64 on the CPU: one step per sequence on its pool row."""
    f64 = lambda t: t.double().numpy()   # noqa: E731
    rows = [int(i) for i in idx]
    gate_args = {n: f64(x[n]) for n in ("A_log", "dt_bias") if x.get(n) is not None}
    o, s = reference.kda_recurrent(*(f64(x[n]) for n in ("q", "k", "v", "g", "beta")), **gate_args,
                                   **bench.REFERENCE[gate], initial_state=f64(pool[rows]))
    pool[rows] = torch.from_numpy(s).to(pool.dtype)
    return torch.from_numpy(o).to(dtype)


GATE_KEYWORDS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                 "safe_gate", "lower_bound")


def fake_ours(seen):
    """A stand-in for pykda's fused_recurrent_kda (fla's keywords): the float64 step of the gate
    mode its keywords ask for; returns (o, None) as the op does without output_final_state."""
    def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, *, initial_state, state_indices,
                            state_v_first=False, rows_per_thread=None, stages=None, **flags):
        assert set(flags) <= set(GATE_KEYWORDS), flags
        seen.append((rows_per_thread, stages, reference_mode(flags)))
        x = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        pool = initial_state if state_v_first else initial_state.transpose(-1, -2)   # the step's writes show through
        return _reference_step(x, pool, state_indices, reference_mode(flags)), None
    return fused_recurrent_kda


class _Timer:
    def median_us(self, fn, warmup=5, repeats=50):
        fn()
        return 10.0

    def copy_us(self, nbytes, warmup=3, repeats=50):
        return 5.0


def cpu_quick_case(monkeypatch, gates=("safe",)):
    """The bench's quick cases as small float32 cases (D 8), one per gate mode, their inputs
    drawn on the CPU."""
    monkeypatch.setattr(bench, "D", 8)
    monkeypatch.setattr(bench, "QUICK", tuple((gate, "float32", 2, 3) for gate in gates))
    monkeypatch.setattr(bench, "SPEC_QUICK", ())   # the speculative-decode table: on the GPU only
    real_inputs = bench._inputs

    def cpu_inputs(B, H, pool_dtype, gate="safe", T=None):
        with monkeypatch.context() as m:
            m.setattr(torch, "Generator", lambda device=None: torch.random.default_generator.__class__())
            real_randn, real_rand, real_randperm = torch.randn, torch.rand, torch.randperm
            m.setattr(torch, "randn", lambda *s, generator=None, device=None: real_randn(*s, generator=generator))
            m.setattr(torch, "rand", lambda *s, generator=None, device=None: real_rand(*s, generator=generator))
            m.setattr(torch, "randperm", lambda n, device=None: real_randperm(n))
            return real_inputs(B, H, pool_dtype, gate, T)
    monkeypatch.setattr(bench, "_inputs", cpu_inputs)


def test_run_end_to_end_with_the_gpu_stubbed(fake_fla, monkeypatch, capsys):
    """bench.run's control flow on CPU tensors, one row per gate mode: ours and fla (its serving
    path) both checked against the reference of the row's gate mode."""
    serving, _, mods = fake_fla

    def fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None, inplace_final_state=True,
            ssm_state_indices=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
            use_beta_sigmoid_in_kernel=False, lower_bound=None, state_v_first=False, **kwargs):
        mode = reference_mode(dict(use_gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound,
                                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel))
        serving.append(mode)
        x = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        return _reference_step(x, initial_state, ssm_state_indices, mode), initial_state
    monkeypatch.setattr(mods["fla.ops.kda.fused_recurrent"], "fused_recurrent_kda_fwd", fwd)
    cpu_quick_case(monkeypatch, bench.GATES)
    seen = []
    monkeypatch.setattr(bench, "fused_recurrent_kda", fake_ours(seen))
    monkeypatch.setattr(bench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    rows = bench.run(types.SimpleNamespace(quick=True))
    assert [r["gate"] for r in rows] == list(bench.GATES)
    for row in rows:
        assert row["err"] < 1e-2 and row["fla_err"] < 1e-2, row   # bf16 outputs
        assert row["us"] == 10.0 and row["fla_us"] == 10.0 and row["copy_us"] == 5.0
        assert row["kfirst_us"] == 10.0 and row["kfirst_err"] < 1e-2, row   # the K-first copy, checked
        assert row["pct_same_copy"] == 50.0 and row["state_bytes"] == 2 * 3 * 2 * 8 * 8 * 4
        assert "graph_us" in row or "graph_error" in row
        assert row["fla"] == bench.SERVING
    assert {mode for *_, mode in seen} == set(serving) == set(bench.GATES), "each row ran in its own gate mode"
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("us: kernel")


def test_vllm_rows_pass_fp32_log_decay_and_probabilities(monkeypatch):
    """The "vllm" inputs: g the softplus gate's fp32 log-decay, beta fp32 sigmoid(beta), no
    A_log or dt_bias (they would be refused with use_gate_in_kernel=False)."""
    cpu_quick_case(monkeypatch)
    x, _, _ = bench._inputs(2, 3, "float32", "vllm")
    raw, _, _ = bench._inputs(2, 3, "float32", "softplus")
    assert "A_log" not in x and "dt_bias" not in x
    assert x["g"].dtype == torch.float32 and x["beta"].dtype == torch.float32
    expected = reference.kda_gate(raw["g"].double().numpy(), raw["A_log"].double().numpy(),
                                  raw["dt_bias"].double().numpy(), None, "softplus")
    assert reference.relative_error(x["g"].double().numpy(), expected) < 1e-6
    assert torch.allclose(x["beta"], torch.sigmoid(raw["beta"].float()))


def test_bench_options_reach_only_the_benches_that_take_them():
    """A sweep option a bench does not take is an error, not silently ignored."""
    from pykda.__main__ import build_parser
    from pykda.bench import check_options, settings
    parse = build_parser().parse_args
    check_options(parse(["bench", "kda-decode", "--rows-per-thread", "4,8", "--stages", "3"]))
    check_options(parse(["bench", "decode", "--chunk-size", "1024", "--shapes", "32/8:100000"]))
    check_options(parse(["bench", "kda", "--shapes", "4:262144"]))
    for argv, option in ((["bench", "kda-decode", "--chunk-size", "512"], "--chunk-size"),
                         (["bench", "decode", "--rows-per-thread", "4"], "--rows-per-thread"),
                         (["bench", "paged-decode", "--stages", "3"], "--stages"),
                         (["bench", "kda-decode", "--shapes", "32/8:100"], "--shapes")):
        with pytest.raises(ValueError, match=f"does not take {option}"):
            check_options(parse(argv))
    assert settings("0,4,8") == [None, 4, 8] and settings(None) == [None]


def test_sweep_rows_time_each_setting(monkeypatch, capsys):
    """--rows-per-thread/--stages: a row per setting, each passed to the op and checked."""
    seen = []
    cpu_quick_case(monkeypatch)
    monkeypatch.setattr(bench, "fused_recurrent_kda", fake_ours(seen))
    monkeypatch.setattr(bench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    rows = bench.run(types.SimpleNamespace(quick=True, rows_per_thread="4,8", stages="0"))
    assert [(r["rows_per_thread"], r["stages"]) for r in rows] == [(4, None), (8, None)]
    assert all(r["err"] < 1e-2 and r["us"] == 10.0 and r["gate"] == "safe" for r in rows)
    assert set(seen) == {(4, None, "safe"), (8, None, "safe")}
    assert "auto" in capsys.readouterr().out


def test_busy_host_us_times_bursts_behind_a_sleep_the_gpu_is_still_running(monkeypatch):
    """Each burst's calls are made behind a GPU sleep; a burst the sleep did not outlast (the stream
    idle at its end) is not counted and is made again behind a sleep four times as long."""
    from pykda.bench import timing
    events, idle_at_end = [], iter([True, False, False, False])

    class Stream:
        def query(self):
            events.append("query")
            return next(idle_at_end)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: events.append(("sleep", cycles)), raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    calls = []
    us = timing.busy_host_us(lambda: calls.append(1), n=5, bursts=3)
    assert len(calls) == 1 + 4 * 5, "the warm-up, then four bursts of five (the first not counted)"
    sleeps = [e[1] for e in events if type(e) is tuple]
    assert sleeps == [timing.BUSY_SLEEP_CYCLES] + [4 * timing.BUSY_SLEEP_CYCLES] * 3
    assert events.count("query") == 4 and 0 < us < 1e4
    idle_at_end = iter([True] * 10)   # never outlasted: named, not looped forever
    with pytest.raises(RuntimeError, match="outlasted every GPU sleep"):
        timing.busy_host_us(lambda: None, n=5, bursts=3)


def test_timer_rejects_an_unknown_flush_before_allocating():
    from pykda.bench.timing import Timer
    with pytest.raises(ValueError, match=r"flush must be one of \('read', 'write'\); got 'evict'"):
        Timer("evict")


# ---- bench kda (prefill): gate modes, peers, the pool row and the accuracy table, on the CPU ----
def _kda_reference(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, flags):
    """float64 chunk_kda of fla-style keywords on CPU tensors: (o bf16, final states fp32)."""
    f64 = lambda t: None if t is None else t.double().numpy()   # noqa: E731
    mode = reference_mode(flags) if flags.get("use_gate_in_kernel") else "none"
    gate = {"vllm": "none", "none": "none"}.get(mode, mode)
    beta_form = "logit" if flags.get("use_beta_sigmoid_in_kernel") else "prob"
    o, s = reference.kda_recurrent(f64(q), f64(k), f64(v), f64(g), f64(beta), A_log=f64(A_log), dt_bias=f64(dt_bias),
                                   lower_bound=flags.get("lower_bound"), initial_state=f64(initial_state),
                                   cu_seqlens=f64(cu_seqlens).astype(np.int64) if cu_seqlens is not None else None,
                                   gate=gate, beta_form=beta_form, qk_norm=bool(flags.get("use_qk_l2norm_in_kernel")))
    return torch.from_numpy(o).to(torch.bfloat16), torch.from_numpy(s).float()


def fake_chunk_kda(calls):
    """pykda's chunk_kda (its keywords, its pool semantics) as the float64 reference."""
    def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False, safe_gate=False, lower_bound=None, state_v_first=False, cu_seqlens=None,
                  cu_seqlens_cpu=None, *, A_log=None, dt_bias=None, state_indices=None, final_state=None, chunk_size=None,
                  warps=None, stages=None, segment_chunks=None):
        assert (cu_seqlens_cpu is None) == (cu_seqlens is None), "varlen calls pass the host copy"
        if cu_seqlens is not None:
            assert torch.equal(cu_seqlens_cpu, cu_seqlens.cpu())
        flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, lower_bound=lower_bound)
        assert state_v_first and not allow_neg_eigval
        assert safe_gate == (lower_bound is not None), "the bounded gate asks for safe_gate=True"
        calls.append(dict(flags, pooled=state_indices is not None, plan=(chunk_size, warps, stages, segment_chunks)))
        s0 = initial_state[state_indices.long()] if state_indices is not None else initial_state
        o, s = _kda_reference(q, k, v, g, beta, A_log, dt_bias, s0, cu_seqlens, flags)
        if state_indices is not None:
            initial_state[state_indices.long()] = s
            return o, (initial_state if output_final_state else None)
        if final_state is not None:
            final_state.copy_(s)
            s = final_state
        return o, (s if output_final_state or final_state is not None else None)
    return chunk_kda


@pytest.fixture
def kda_bench_on_cpu(monkeypatch):
    """bench kda with D 8, two small shapes (the first the pool shape), torch on the CPU, a
    fake FlashKDA and fla, and chunk_kda as the reference; returns the calls of each op."""
    from pykda.bench import kda as kbench
    calls = {"pykda": [], "flashkda": [], "fla": []}
    lengths = [5, 0, 11, 7]
    monkeypatch.setattr(kbench, "D", 8)
    monkeypatch.setattr(kbench, "SHAPES", [(2, lengths, True), (3, [20], False)])
    monkeypatch.setattr(kbench, "POOL_SHAPE", (2, lengths))
    monkeypatch.setattr(kbench, "FLA_SHAPES", {0})
    real_inputs = kbench._inputs
    monkeypatch.setattr(kbench, "_inputs", lambda H, lens, st, seed=0: real_inputs(H, [12] if H == 8 else lens, st, seed))
    for name in ("randn", "rand", "randperm", "tensor", "empty", "ones", "zeros", "arange"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, device=None, **k: _real(*a, **k))
    monkeypatch.setattr(torch, "Generator", lambda device=None: torch.random.default_generator.__class__())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(kbench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    monkeypatch.setattr(kbench, "HOST_SHAPE", (2, [5, 3]))
    monkeypatch.setattr(kbench.timing, "host_us", lambda fn, n=300: (fn(), 12.5)[1])
    monkeypatch.setattr(kbench.timing, "busy_host_us", lambda fn, n=100, bursts=7: (fn(), 9.5)[1])
    monkeypatch.setattr(kbench.timing, "graph_host_us", lambda fn, n=300: (fn(), 3.25)[1])
    monkeypatch.setattr(kbench, "chunk_kda", fake_chunk_kda(calls["pykda"]))

    def flashkda_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
                     cu_seqlens=None):
        flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     lower_bound=lower_bound)
        calls["flashkda"].append(flags)
        o, s = _kda_reference(q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, flags)
        out.copy_(o)
        if final_state is not None:
            final_state.copy_(s)

    def fla_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                      allow_neg_eigval=False, safe_gate=False, lower_bound=None, state_v_first=False,
                      cu_seqlens=None, **kwargs):
        assert set(kwargs) == {"A_log", "dt_bias", "cu_seqlens_cpu"} and state_v_first
        flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, lower_bound=lower_bound)
        calls["fla"].append(flags)
        o, s = _kda_reference(q, k, v, g, beta, kwargs["A_log"], kwargs["dt_bias"], initial_state, cu_seqlens, flags)
        return o, (s if output_final_state else None)
    monkeypatch.setattr(kbench, "_peers", lambda: {"flashkda": types.SimpleNamespace(fwd=flashkda_fwd),
                                                   "fla": fla_chunk_kda})
    return kbench, calls


def test_bench_kda_gate_modes_pool_row_and_accuracy(kda_bench_on_cpu, capsys):
    kbench, calls = kda_bench_on_cpu
    result = kbench.run(types.SimpleNamespace(quick=False))
    rows = result["timing"]
    assert [(r["H"], r["gate"], r["state"]) for r in rows] == [
        (2, "softplus", True), (2, "safe", True), (2, "softplus", "pool"), (3, "softplus", False), (3, "safe", False)]
    by = {(r["H"], r["gate"], r["state"]): r for r in rows}
    soft, safe, pool = by[2, "softplus", True], by[2, "safe", True], by[2, "softplus", "pool"]
    assert soft["pykda"] == safe["pykda"] == 10.0 / 1e3
    assert soft["flashkda"] is None and soft["flashkda_error"] == kbench.UNBOUNDED and safe["flashkda"] == 0.01
    assert soft["fla"] == 0.01 and "fla" not in safe, "fla: the softplus gate, on FLA_SHAPES only"
    assert "fla" not in by[3, "softplus", False]
    # FlashKDA only ever ran the bounded gate; fla only Kimi Linear's
    assert calls["flashkda"] and all(c["lower_bound"] == kbench.LOWER_BOUND for c in calls["flashkda"])
    assert calls["fla"] and all(c["use_gate_in_kernel"] and c["lower_bound"] is None and c["use_qk_l2norm_in_kernel"]
                                and c["use_beta_sigmoid_in_kernel"] for c in calls["fla"])
    assert {c["lower_bound"] for c in calls["pykda"]} == {None, kbench.LOWER_BOUND}
    # the pool row: the pooled call matches the contiguous one, timed beside it
    assert pool["pykda"] == pool["contiguous"] == 0.01 and pool["pool_rows"] == 8 * 4
    assert pool["out_diff"] < 1e-12 and pool["state_diff"] < 1e-12 and pool["others_untouched"] and pool["final_none"]
    assert any(c["pooled"] for c in calls["pykda"])
    # accuracy: both gates, FlashKDA's softplus entry says why it did not run
    acc = result["accuracy"]
    assert set(acc) == {"softplus", "safe"}
    assert acc["softplus"]["flashkda"] == {"error": kbench.UNBOUNDED}
    for gate in acc:
        for name in ("pykda", "fla") if gate == "softplus" else ("pykda", "flashkda"):
            assert acc[gate][name]["out"] < 1e-2 and acc[gate][name]["state"] < 1e-6, (gate, name)
    out = capsys.readouterr().out
    assert kbench.UNBOUNDED in out and "pool in place (H=2 T=23 N=4, softplus gate, pool of 32 rows)" in out
    assert "accuracy, softplus gate" in out and "accuracy, safe gate" in out
    assert result["host"] == dict(H=2, T=8, N=2, host_us=12.5, busy_us=9.5, graph_us=3.25)
    assert ("host: chunk_kda (H=2 T=8 N=2, the pool, softplus gate): 12.5 µs per call with the GPU idle, 9.5 back "
            "to back behind GPU work, 3.2 per CUDA-graph replay") in out


def test_bench_kda_shapes_option_runs_the_rows_given(kda_bench_on_cpu):
    """--shapes H:LENGTHS replaces the bench's rows (LENxN repeats one length); fla, which autotunes
    for 90 s per shape, runs only on the default rows."""
    kbench, calls = kda_bench_on_cpu
    result = kbench.run(types.SimpleNamespace(quick=False, shapes="2:9+4x2,3:17"))
    rows = result["timing"]
    assert [(r["H"], r["T"], r["N"], r["gate"], r["state"]) for r in rows] == [
        (2, 17, 3, "softplus", False), (2, 17, 3, "safe", False), (3, 17, 1, "softplus", False),
        (3, 17, 1, "safe", False)]
    assert all("fla" not in r for r in rows) and rows[0]["pykda"] == 0.01


@pytest.mark.parametrize("text", ["4", "x:1", "0:10", "4:0", "4:10x0", "4:-3"])
def test_bench_kda_shapes_are_checked(text):
    from pykda.bench import kda as kbench
    with pytest.raises(ValueError, match="--shapes"):
        kbench.parse_shapes(text)
    assert kbench.parse_shapes("4:262144,8:131072+1024x2") == [(4, [262144], False), (8, [131072, 1024, 1024], False)]


def test_bench_kda_pool_row_reports_a_pool_that_differs(kda_bench_on_cpu, monkeypatch):
    """The pool row's check fails visibly when the pooled call does not match the contiguous one."""
    kbench, calls = kda_bench_on_cpu
    real = kbench.chunk_kda

    def off_by_one(*a, state_indices=None, **k):
        if state_indices is not None:
            state_indices = (state_indices + 1) % k["initial_state"].shape[0]   # reads and writes other rows
        return real(*a, state_indices=state_indices, **k)
    monkeypatch.setattr(kbench, "chunk_kda", off_by_one)
    result = kbench.run(types.SimpleNamespace(quick=False))
    (pool,) = [r for r in result["timing"] if r["state"] == "pool"]
    assert pool["out_diff"] > 1e-3 and pool["state_diff"] > 1e-3


def test_bench_kda_sweeps_the_planner_s_settings(kda_bench_on_cpu, capsys):
    """--chunk-size/--warps/--stages/--segment-chunks: pykda alone, the planner's choice first then
    each setting (segment_chunks 0: the serial chain, auto: the planner's), every setting reaching
    chunk_kda, a setting left to the planner not passed at all."""
    kbench, calls = kda_bench_on_cpu
    result = kbench.run(types.SimpleNamespace(quick=False, shapes="3:17", chunk_size="32", warps="2,4",
                                              segment_chunks="0,auto"))
    rows = result["timing"]
    points = [(None, None, None, None), (32, 2, None, 0), (32, 2, None, None), (32, 4, None, 0), (32, 4, None, None)]
    assert [(r["gate"], tuple(r[k] for k in kbench.KNOBS)) for r in rows] == \
        [(gate, p) for gate in kbench.GATES for p in points]
    plans = [c["plan"] for c in calls["pykda"]]
    assert [p for i, p in enumerate(plans) if i == 0 or p != plans[i - 1]] == points * 2   # (each timed call run twice)
    assert not calls["flashkda"] and not calls["fla"] and set(result) == {"timing"}
    out = capsys.readouterr().out
    assert "x auto" in out and out.count(" auto ") >= 2 and " chunk " in out


def test_bench_kda_takes_its_sweep_options():
    from pykda.__main__ import build_parser
    from pykda.bench import check_options, settings
    parse = build_parser().parse_args
    check_options(parse(["bench", "kda", "--chunk-size", "16,32", "--warps", "2,4", "--stages", "3",
                        "--segment-chunks", "0,128"]))
    with pytest.raises(ValueError, match="does not take --warps"):
        check_options(parse(["bench", "decode", "--warps", "2"]))
    assert settings("0,128,auto", zero=0) == [0, 128, None] and settings("auto,4") == [None, 4]
    with pytest.raises(ValueError, match=r"--warps: '2,x' is not a comma list of ints and auto"):
        check_options(parse(["bench", "kda", "--warps", "2,x"]))


def test_speculative_rows_time_target_verify_on_the_same_tokens(monkeypatch, capsys):
    """A speculative row also times SGLang's target verify of its tokens (each sequence from its
    table's first row, a [B, T, H, V, K] buffer at slots 0..B-1, the pool only read) and the same
    tokens with 1-D rows (the final state written once); the table prints both beside the K-first
    time."""
    calls = []

    def recorder(q, k, v, g, beta, **kw):
        calls.append(kw)
        return torch.zeros_like(v), None
    monkeypatch.setattr(bench, "fused_recurrent_kda", recorder)
    B, T, H, D = 3, 2, 2, 8
    x = dict(q=torch.zeros(B, T, H, D), k=torch.zeros(B, T, H, D), v=torch.zeros(B, T, H, D),
             g=torch.zeros(B, T, H, D), beta=torch.zeros(B, T, H))
    pool, idx = torch.zeros(9, H, D, D), torch.arange(6, dtype=torch.int32).reshape(B, T)
    row = {}
    bench._verify_step(row, x, pool, idx, "safe", _Timer(), 5)
    chain, tree = calls
    assert row == {"verify_us": 10.0, "tree_us": 10.0}
    for kw in (chain, tree):
        assert kw["disable_state_update"] is True and kw["initial_state"] is pool
        assert kw["state_indices"].tolist() == [0, 2, 4] and kw["intermediate_state_indices"].tolist() == [0, 1, 2]
        assert tuple(kw["intermediate_states_buffer"].shape) == (B, T, H, D, D)
    assert chain["retrieve_parent_token"] is None and tree["retrieve_parent_token"].tolist() == [[-1, 0]] * B
    calls.clear()
    bench._one_row_step(row, x, pool, idx, "safe", _Timer(), 5)
    (kw,) = calls
    assert kw["state_indices"].tolist() == [0, 2, 4] and kw["initial_state"] is pool
    assert "num_accepted_tokens" not in kw and "intermediate_states_buffer" not in kw, "1-D rows, the final state only"
    assert row["oned_us"] == 10.0 and row["oned_tbs"] == pytest.approx(2 * B * H * 128 * 128 * 4 / 10.0 / 1e6)
    bench._print_spec([dict(gate="safe", pool="float32", H=H, B=B, T=1, us=5.0),
                       dict(gate="safe", pool="float32", H=H, B=B, T=2, us=8.0, verify_us=7.5, tree_us=7.75,
                            oned_us=6.25, oned_tbs=1.23)])
    lines = capsys.readouterr().out.splitlines()
    assert "verify" in lines[2] and "tree" in lines[2] and "1-D" in lines[2]
    assert "7.5" in lines[4] and "7.8" in lines[4] and "6.2" in lines[4] and "1.23" in lines[4]
