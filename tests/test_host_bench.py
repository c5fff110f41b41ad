"""CPU tests of `bench kda-decode`'s plumbing: which fla entry point it calls and how, the
correctness check it applies to both, the case list and the table (no GPU needed)."""
import sys
import types

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


def test_cases_and_table(capsys):
    full = bench.cases(False)
    assert len(full) == len(bench.POOLS) * len(bench.HEADS) * len(bench.BATCHES)
    assert set(bench.cases(True)) <= set(full)
    rows = [dict(pool="float32", H=32, B=1, us=7.3, host_us=20.0, graph_us=3.1, tbs=0.58, pct_copy=14.0,
                 pct_same_copy=60.0, err=1e-3, fla_us=9.7, fla_host_us=90.0, fla_graph_us=3.0, fla_err=2e-3),
            dict(pool="bfloat16", H=8, B=256, us=None, err=2e-3, fla_error="RuntimeError: x")]
    bench._print(rows, bench.SERVING)
    out = capsys.readouterr().out
    assert "1.33" in out and "60" in out and "fla_error: RuntimeError: x" in out


def _reference_step(x, pool, idx):
    """What both ops do, in float64 on the CPU: one step per sequence on its pool row."""
    f64 = lambda t: t.double().numpy()   # noqa: E731
    rows = [int(i) for i in idx]
    o, s = reference.kda_recurrent(*(f64(x[n]) for n in ("q", "k", "v", "g", "beta")), A_log=f64(x["A_log"]),
                                   dt_bias=f64(x["dt_bias"]), lower_bound=bench.LOWER_BOUND,
                                   initial_state=f64(pool[rows]))
    pool[rows] = torch.from_numpy(s).to(pool.dtype)
    return torch.from_numpy(o).to(torch.bfloat16)


class _Timer:
    def median_us(self, fn, warmup=5, repeats=50):
        fn()
        return 10.0

    def copy_us(self, nbytes, warmup=3, repeats=50):
        return 5.0


def cpu_quick_case(monkeypatch):
    """The bench's quick cases as one small float32 case (D 8), its inputs drawn on the CPU."""
    monkeypatch.setattr(bench, "D", 8)
    monkeypatch.setattr(bench, "QUICK", (("float32", 2, 3),))
    real_inputs = bench._inputs

    def cpu_inputs(B, H, pool_dtype):
        with monkeypatch.context() as m:
            m.setattr(torch, "Generator", lambda device=None: torch.random.default_generator.__class__())
            real_randn, real_rand, real_randperm = torch.randn, torch.rand, torch.randperm
            m.setattr(torch, "randn", lambda *s, generator=None, device=None: real_randn(*s, generator=generator))
            m.setattr(torch, "rand", lambda *s, generator=None, device=None: real_rand(*s, generator=generator))
            m.setattr(torch, "randperm", lambda n, device=None: real_randperm(n))
            return real_inputs(B, H, pool_dtype)
    monkeypatch.setattr(bench, "_inputs", cpu_inputs)


def test_run_end_to_end_with_the_gpu_stubbed(fake_fla, monkeypatch, capsys):
    """bench.run's control flow on CPU tensors: ours and fla (its serving path) both checked."""
    serving, _, mods = fake_fla

    def fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None, inplace_final_state=True,
            ssm_state_indices=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
            use_beta_sigmoid_in_kernel=False, lower_bound=None, state_v_first=False, **kwargs):
        serving.append(1)
        x = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        return _reference_step(x, initial_state, ssm_state_indices), initial_state
    monkeypatch.setattr(mods["fla.ops.kda.fused_recurrent"], "fused_recurrent_kda_fwd", fwd)
    cpu_quick_case(monkeypatch)
    monkeypatch.setattr(bench, "fused_recurrent_kda",
                        lambda q, k, v, g, beta, *, initial_state, state_indices, **kw:
                        _reference_step(dict(q=q, k=k, v=v, g=g, beta=beta, **kw), initial_state, state_indices))
    monkeypatch.setattr(bench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    rows = bench.run(types.SimpleNamespace(quick=True))
    (row,) = rows
    assert row["err"] < 1e-2 and row["fla_err"] < 1e-2   # bf16 outputs
    assert row["us"] == 10.0 and row["fla_us"] == 10.0 and row["copy_us"] == 5.0
    assert row["pct_same_copy"] == 50.0 and row["state_bytes"] == 2 * 3 * 2 * 8 * 8 * 4
    assert "graph_us" in row or "graph_error" in row
    assert len(serving) > 3 and row["fla"] == bench.SERVING
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("us: kernel")


def test_bench_options_reach_only_the_benches_that_take_them():
    """A sweep option a bench does not take is an error, not silently ignored."""
    from pykda.__main__ import build_parser
    from pykda.bench import check_options, settings
    parse = build_parser().parse_args
    check_options(parse(["bench", "kda-decode", "--rows-per-thread", "4,8", "--stages", "3"]))
    check_options(parse(["bench", "decode", "--chunk-size", "1024", "--shapes", "32/8:100000"]))
    for argv, option in ((["bench", "kda-decode", "--chunk-size", "512"], "--chunk-size"),
                         (["bench", "decode", "--rows-per-thread", "4"], "--rows-per-thread"),
                         (["bench", "kda", "--stages", "3"], "--stages"),
                         (["bench", "kda-decode", "--shapes", "32/8:100"], "--shapes")):
        with pytest.raises(ValueError, match=f"does not take {option}"):
            check_options(parse(argv))
    assert settings("0,4,8") == [None, 4, 8] and settings(None) == [None]


def test_sweep_rows_time_each_setting(monkeypatch, capsys):
    """--rows-per-thread/--stages: a row per setting, each passed to the op and checked."""
    seen = []
    cpu_quick_case(monkeypatch)

    def op(q, k, v, g, beta, *, initial_state, state_indices, rows_per_thread, stages, **kw):
        seen.append((rows_per_thread, stages))
        return _reference_step(dict(q=q, k=k, v=v, g=g, beta=beta, **kw), initial_state, state_indices)
    monkeypatch.setattr(bench, "fused_recurrent_kda", op)
    monkeypatch.setattr(bench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    rows = bench.run(types.SimpleNamespace(quick=True, rows_per_thread="4,8", stages="0"))
    assert [(r["rows_per_thread"], r["stages"]) for r in rows] == [(4, None), (8, None)]
    assert all(r["err"] < 1e-2 and r["us"] == 10.0 for r in rows)
    assert set(seen) == {(4, None), (8, None)}
    assert "auto" in capsys.readouterr().out


def test_timer_rejects_an_unknown_flush_before_allocating():
    from pykda.bench.timing import Timer
    with pytest.raises(ValueError, match=r"flush must be one of \('read', 'write'\); got 'evict'"):
        Timer("evict")
