"""CPU tests of the benches' sweeps as people look at them: tqdm progress (the `progress` extra) with a
plain fallback, `--plot FILE.png` (the `plot` extra) and the CLI's checks of it; the sweeps of `bench decode`
and `bench kda-decode` end to end on CPU stand-ins (the stubs of tests/test_host_bench.py). Both extras
stay optional: what needs matplotlib is skipped without it."""
import json
import sys
import types

import numpy as np
import pytest

from pykda import reference
from pykda.__main__ import main as cli
from pykda.bench import plot as plotting
from pykda.progress import progress

try:
    import torch
except ImportError:
    torch = None
try:
    import matplotlib
    matplotlib.use("Agg")
except ImportError:
    matplotlib = None

if torch is not None:
    from test_host_bench import _reference_step, _Timer, cpu_quick_case, fake_fla, fake_ours, reference_mode  # noqa: F401

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch (the CPU build is enough)")
needs_matplotlib = pytest.mark.skipif(matplotlib is None, reason="needs matplotlib (the plot extra)")
PNG = b"\x89PNG\r\n\x1a\n"


# ---- progress ----
def test_progress_without_tqdm_is_the_iterable_itself(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)   # import tqdm raises ImportError
    items = [1, 2, 3]
    assert progress(items, "bench", label=str) is items


def test_progress_with_tqdm_shows_a_bar_and_each_label(monkeypatch):
    bars = []

    class FakeTqdm:
        def __init__(self, items, **kwargs):
            self.items, self.kwargs, self.postfix = items, kwargs, []
            bars.append(self)

        def __iter__(self):
            return iter(self.items)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.closed = True

        def set_postfix_str(self, text, refresh=True):
            self.postfix.append(text)
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    assert list(progress([1, 2], "bench decode", label=lambda i: f"shape {i}", unit="shape")) == [1, 2]
    (bar,) = bars
    assert bar.kwargs["desc"] == "bench decode" and bar.kwargs["unit"] == "shape"
    assert bar.kwargs["leave"] is False, "cleared when done: the tables read the same with or without tqdm"
    assert bar.postfix == ["shape 1", "shape 2"] and bar.closed


# ---- the plot helper ----
def _decode_rows():
    """Fake sweep rows as bench decode writes them: two shapes, two chunk sizes, one failed
    setting, peers on the first shape only."""
    rows = []
    for (batch, hq, hkv, S), peers in (((1, 32, 8, 131072), dict(cudnn=dict(us=90.0, err=1e-3),
                                                                  flash=dict(us=120.0, err=1e-3))),
                                       ((8, 32, 8, 32768), {})):
        for chunk, us in ((512, 70.0), (1024, 60.0 if batch == 1 else None)):
            tbs = 2 * batch * S * hkv * 128 * 2 / us / 1e6 if us else None
            rows.append(dict(batch=batch, hq=hq, hkv=hkv, kv_len=S, chunk_size=chunk, stages=None, us=us, us_nhd=us,
                             tbs=tbs, pct_copy=100 * tbs / 4.0 if tbs else None, err=1e-3, err_nhd=1e-3, peers=peers))
    return rows


def _kda_decode_rows():
    rows = []
    for case, fla_us in ((("safe", "float32", 32, 64), 12.0), (("vllm", "bfloat16", 8, 256), None)):
        for rpt, stages, us in ((4, None, 10.0), (8, None, 9.0), (4, 3, None)):
            row = dict(zip(("gate", "pool", "H", "B"), case), rows_per_thread=rpt, stages=stages, us=us,
                       tbs=3.0 if us else None, pct_copy=75.0 if us else None, err=1e-3 if us else None)
            if fla_us:
                row["fla_us"] = fla_us
            if us is None:
                row["error"] = "ValueError: no such setting"
            rows.append(row)
    return rows


def _line_styles(ax):
    return [(line.get_linestyle(), line.get_color()) for line in ax.get_lines()]


@needs_matplotlib
def test_plot_writes_a_png_a_line_per_shape_and_the_peer_dashed_in_its_color(tmp_path):
    from pykda.bench import decode
    path = tmp_path / "decode.png"
    fig = decode.plot(_decode_rows(), str(path), "NVIDIA H200")
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000
    ax_us, ax_tbs = fig.axes[:2]
    styles = _line_styles(ax_us)
    assert [s for s, _ in styles] == ["-", "--", "-"], "two shapes solid, the first one's fastest peer dashed"
    assert styles[1][1] == styles[0][1] != styles[2][1]
    assert list(ax_us.get_lines()[1].get_ydata()) == [90.0, 90.0], "the fastest peer: cudnn"
    assert [t.get_text() for t in ax_us.get_xticklabels()] == ["512", "1024"]
    assert ax_us.get_xlabel() == "chunk size" and ax_us.get_yscale() == "log"
    labels = ax_us.get_legend_handles_labels()[1]
    assert labels == ["32/8 S=131072  (dashed: cudnn)", "32/8 S=32768 B=8"]
    # the TB/s panel: the peer's TB/s from the shape's bytes, the copy ceiling dotted
    tbs_styles = _line_styles(ax_tbs)
    assert [s for s, _ in tbs_styles] == ["-", "--", "-", ":"]
    first = _decode_rows()[0]
    assert ax_tbs.get_lines()[1].get_ydata()[0] == pytest.approx(first["tbs"] * first["us"] / 90.0)
    assert ax_tbs.get_lines()[3].get_ydata()[0] == pytest.approx(4.0)
    assert "NVIDIA H200" in fig._suptitle.get_text()


@needs_matplotlib
def test_plot_of_two_swept_parameters_and_failed_settings(tmp_path):
    from pykda.bench import kda_decode
    path = tmp_path / "kda-decode.png"
    fig = kda_decode.plot(_kda_decode_rows(), str(path))
    assert path.read_bytes()[:8] == PNG
    ax_us = fig.axes[0]
    assert [t.get_text() for t in ax_us.get_xticklabels()] == ["4/auto", "8/auto", "4/3"]
    assert ax_us.get_xlabel() == "rows per thread / stages"
    assert [s for s, _ in _line_styles(ax_us)] == ["-", "--", "-"], "fla dashed where it was timed"
    ys = ax_us.get_lines()[0].get_ydata()
    assert list(ys[:2]) == [10.0, 9.0] and ys[2] != ys[2], "a failed setting is a gap"


@needs_matplotlib
def test_plot_of_a_sweep_where_nothing_ran(tmp_path):
    from pykda.bench import kda_decode
    rows = [dict(gate="safe", pool="float32", H=8, B=1, rows_per_thread=rpt, stages=None, error="ValueError: x")
            for rpt in (4, 8)]
    fig = kda_decode.plot(rows, str(tmp_path / "none.png"))
    assert (tmp_path / "none.png").read_bytes()[:8] == PNG and fig.axes[0].get_yscale() == "linear"


def test_plot_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not plotting.available()
    with pytest.raises(SystemExit, match=r"the `plot` extra: pip install 'pykda\[plot\]'"):
        plotting.require()


# ---- the CLI ----
@pytest.fixture
def no_gpu_work(monkeypatch):
    """runtime.require_gpu fails the test: the CLI must answer before any GPU work."""
    from pykda import runtime

    def require_gpu():
        raise AssertionError("GPU work started")
    monkeypatch.setattr(runtime, "require_gpu", require_gpu)


@pytest.mark.parametrize("argv", [["bench", "decode", "--chunk-size", "512,1024"],
                                  ["bench", "kda-decode", "--rows-per-thread", "4,8", "--stages", "2,3"]])
def test_cli_rejects_plot_without_matplotlib_before_gpu_work(monkeypatch, no_gpu_work, tmp_path, capsys, argv):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as exc:
        cli(argv + ["--plot", str(tmp_path / "sweep.png"), "--json", str(tmp_path / "r.json")])
    assert exc.value.code == plotting.MISSING and "`plot` extra" in exc.value.code and "pykda[plot]" in exc.value.code
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "sweep.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["bench", "kda", "--plot", "x.png"], "bench kda does not take --plot"),
    (["bench", "decode", "--plot", "x.png"], "--plot draws a sweep: give --chunk-size or --stages"),
    (["bench", "kda-decode", "--quick", "--plot", "x.png"], "--plot draws a sweep: give --rows-per-thread or --stages"),
    (["bench", "kda-decode", "--chunk-size", "512"], "bench kda-decode does not take --chunk-size"),
])
def test_cli_rejects_a_plot_of_no_sweep(no_gpu_work, argv, message):
    with pytest.raises(SystemExit) as exc:
        cli(argv)
    assert exc.value.code == f"python -m pykda bench: {message}"


# ---- the sweeps end to end on CPU stand-ins ----
@pytest.fixture
def bench_main(monkeypatch, tmp_path):
    """Run `python -m pykda bench ...` with no GPU: require_gpu passes, the environment is fake;
    returns (JSON results, stdout) of a run."""
    import pykda.bench
    from pykda import runtime
    monkeypatch.setattr(runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(pykda.bench, "environment", lambda: {"device": "CPU stand-in"})

    def run(argv, capsys):
        path = tmp_path / "bench.json"
        assert cli(argv + ["--json", str(path)]) == 0
        data = json.loads(path.read_text())
        return data["results"], capsys.readouterr().out
    return run


def _plot_args(with_plot, tmp_path):
    if with_plot and matplotlib is None:
        pytest.skip("needs matplotlib (the plot extra)")
    return ["--plot", str(tmp_path / "sweep.png")] if with_plot else []


def _fake_fla_forward(calls):
    """fla's serving forward as the float64 step of the gate mode its keywords ask for."""
    def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                inplace_final_state=True, ssm_state_indices=None, use_qk_l2norm_in_kernel=False,
                                use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, lower_bound=None,
                                state_v_first=False, **kwargs):
        mode = reference_mode(dict(use_gate_in_kernel=use_gate_in_kernel, lower_bound=lower_bound,
                                   use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel))
        calls.append(mode)
        x = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        return _reference_step(x, initial_state, ssm_state_indices, mode), initial_state
    return fused_recurrent_kda_fwd


@needs_torch
@pytest.mark.parametrize("with_plot", [False, True])
def test_kda_decode_sweep_rows_and_plot(fake_fla, bench_main, monkeypatch, tmp_path, capsys, with_plot):
    """--rows-per-thread/--stages: a row per case and setting, as before; with --plot fla is timed
    once per case (its µs in each of the case's rows) and the sweep is drawn."""
    from pykda.bench import kda_decode as bench
    serving, _, mods = fake_fla
    monkeypatch.setattr(mods["fla.ops.kda.fused_recurrent"], "fused_recurrent_kda_fwd", _fake_fla_forward(serving))
    cpu_quick_case(monkeypatch, ("safe", "softplus"))
    seen = []
    monkeypatch.setattr(bench, "fused_recurrent_kda", fake_ours(seen))
    monkeypatch.setattr(bench.timing, "start", lambda flush="read": (_Timer(), 4.0))
    rows, out = bench_main(["bench", "kda-decode", "--quick", "--rows-per-thread", "4,8", "--stages", "0"]
                           + _plot_args(with_plot, tmp_path), capsys)
    assert [(r["gate"], r["rows_per_thread"], r["stages"]) for r in rows] == [
        ("safe", 4, None), ("safe", 8, None), ("softplus", 4, None), ("softplus", 8, None)]
    assert all(r["err"] < 1e-2 and r["us"] == 10.0 for r in rows)
    assert set(seen) == {(rpt, None, gate) for gate in ("safe", "softplus") for rpt in (4, 8)}
    sweep_keys = {"gate", "pool", "H", "B", "rows_per_thread", "stages", "err", "us", "tbs", "pct_copy"}
    if with_plot:
        # per case, not per setting: its checked step and the stand-in timer's one call
        assert serving == ["safe", "safe", "softplus", "softplus"], "fla per case, in the case's gate mode"
        assert all(r["fla_us"] == 10.0 and r["fla_err"] < 1e-2 and r["fla"] == bench.SERVING for r in rows)
        assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG
        assert f"wrote {tmp_path / 'sweep.png'}" in out
    else:
        assert not serving and all(set(r) == sweep_keys for r in rows), "without --plot: the rows as before"
    assert "rpt" in out and "auto" in out


def _reference_of(q, k_nhd, v_nhd, lens=None):
    """float64 outputs [B, Hq, D] of NHD buffers, sequence b over its first lens[b] rows."""
    import numpy as np
    lens = [k_nhd.shape[1]] * q.shape[0] if lens is None else lens
    return np.concatenate([reference.batch_decode_attention(q[b:b + 1].double().numpy(),
                                                            k_nhd[b:b + 1, :n].double().numpy(),
                                                            v_nhd[b:b + 1, :n].double().numpy())[0]
                           for b, n in enumerate(lens)])


def _flash_decode_stub(calls):
    """flash_decode as the float64 reference, on either layout, single or batched, kv_lens read."""
    def flash_decode(q, k, v, batched, kv_layout, kv_lens=None, chunk_size=None, stages=None):
        calls.append((chunk_size, stages, kv_layout))
        if not batched:
            q, k, v = q[None], k[None], v[None]
        if kv_layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        o = torch.from_numpy(_reference_of(q, k, v, None if kv_lens is None else kv_lens.tolist())).to(torch.bfloat16)
        return o if batched else o[0]
    return flash_decode


@pytest.fixture
def decode_on_cpu(monkeypatch):
    """bench decode with D 8 on CPU tensors: flash_decode, the reference and SDPA peers as float64
    stand-ins, no torch.compile; returns the (chunk_size, stages, layout) of each pykda call."""
    from pykda.bench import decode
    calls = []
    monkeypatch.setattr(decode, "D", 8)
    monkeypatch.setattr(decode, "flash_decode", _flash_decode_stub(calls))
    monkeypatch.setattr(decode, "float64_outputs", _reference_of)
    monkeypatch.setattr(decode, "_sdpa_peer", lambda backend, q, k_hnd, v_hnd: (
        lambda: None, _flash_decode_stub([])(q, k_hnd, v_hnd, True, "HND")))
    monkeypatch.setattr(decode, "_compile_peer", lambda q, k, v: (None, "n/a"))
    monkeypatch.setattr(decode, "_flashinfer_peers", lambda q, k_hnd, v_hnd, lens, batched: {})
    monkeypatch.setattr(decode.timing, "start", lambda flush="read": (_Timer(), 4.0))
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *s, generator=None, device=None: real_randn(*s, generator=generator))
    monkeypatch.setattr(torch, "Generator", lambda device=None: torch.random.default_generator.__class__())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return calls


@needs_torch
@pytest.mark.parametrize("with_plot", [False, True])
def test_decode_sweep_rows_and_plot(decode_on_cpu, bench_main, tmp_path, capsys, with_plot):
    """--chunk-size/--stages: a row per shape and setting with the sweep table as before; with
    --plot the peers are timed too (in the rows and the table) and the sweep is drawn."""
    rows, out = bench_main(["bench", "decode", "--shapes", "4/2:16,2x4/2:24", "--chunk-size", "8,16",
                            "--stages", "0,2"] + _plot_args(with_plot, tmp_path), capsys)
    settings = [(8, None), (8, 2), (16, None), (16, 2)]
    assert [(r["batch"], r["kv_len"], r["chunk_size"], r["stages"]) for r in rows] == \
        [(1, 16, *s) for s in settings] + [(2, 24, *s) for s in settings]
    assert all(r["err"] < 1e-2 and r["err_nhd"] < 1e-2 and r["us"] == 10.0 for r in rows)
    assert set(decode_on_cpu) == {(c, s, layout) for c, s in settings for layout in ("NHD", "HND")}
    assert "chunk stg" in out
    if with_plot:
        assert all(set(r["peers"]) == {"cudnn", "flash"} and r["peers"]["cudnn"]["us"] == 10.0 for r in rows[4:])
        assert all(r["peers"]["cudnn"]["err"] < 1e-2 for r in rows)
        assert "cudnn us" in out
        assert (tmp_path / "sweep.png").read_bytes()[:8] == PNG
    else:
        assert all(r["peers"] == {} for r in rows) and "cudnn us" not in out, "without --plot: as before"


@needs_torch
def test_decode_grid_rows_peers_and_summary(decode_on_cpu, bench_main, monkeypatch, capsys):
    """--grid: its shapes (D per shape, uneven batches with kv_lens), SDPA only where every
    sequence has the full length, FlashInfer (here a stand-in that reads each sequence's
    length) everywhere, the copy of the same bytes on the large rows, and the summary line."""
    from pykda.bench import decode
    monkeypatch.setattr(decode, "GRID", [(1, 4, 2, 8, 16, False), (3, 4, 1, 16, 24, True)])
    monkeypatch.setattr(decode, "GRID_COPY_BYTES", 1000)
    copies = []
    monkeypatch.setattr(_Timer, "copy_us", lambda self, nbytes, **kw: copies.append(nbytes) or 5.0, raising=False)
    seen = []

    def fake_fi(q, k_hnd, v_hnd, lens, batched):
        seen.append((tuple(k_hnd.shape), None if lens is None else list(lens), batched))
        out = torch.from_numpy(_reference_of(q, k_hnd.transpose(1, 2), v_hnd.transpose(1, 2), lens))
        return {"fi": (lambda: None, out), "fi-tc": (None, "RuntimeError")}
    monkeypatch.setattr(decode, "_flashinfer_peers", fake_fi)
    monkeypatch.setattr(decode, "_sdpa_peer", lambda backend, q, k_hnd, v_hnd: (
        lambda: None, _flash_decode_stub([])(q, k_hnd, v_hnd, True, "HND")))
    rows, out = bench_main(["bench", "decode", "--grid"], capsys)
    assert [(r["batch"], r["D"], r["uneven"]) for r in rows] == [(1, 8, False), (3, 16, True)]
    assert seen[0] == ((1, 2, 16, 8), None, False)
    shape, lens, batched = seen[1]
    assert shape == (3, 1, 24, 16) and batched and lens[0] == 24 and all(1 <= n <= 24 for n in lens)
    assert set(rows[0]["peers"]) == {"cudnn", "flash", "compile", "fi", "fi-tc"}
    assert set(rows[1]["peers"]) == {"fi", "fi-tc"}, "SDPA has no per-sequence lengths"
    assert all(r["err"] < 1e-2 and r["peers"]["fi"]["err"] < 1e-2 for r in rows)
    assert rows[1]["peers"]["fi-tc"]["us"] is None
    assert all(r["pct_same"] == 50.0 for r in rows)   # the stand-in copy (5 µs) over pykda's 10 µs
    # each reference copy moves what the kernel moves (the row's bytes): half of them read, half written
    assert copies == [round(r["tbs"] * r["us"] * 1e6) // 2 for r in rows] and copies[0] > 512
    assert "grid: 2 shapes; best peer µs / pykda µs: worst 1.00" in out and "median 1.00 over 2 shapes" in out
    assert "50-50 % of the bandwidth of a copy moving as many bytes" in out


def test_decode_grid_summary_names_the_rows_a_peer_leads():
    """The summary line: worst and median of the fastest peer's µs over pykda's, then each row
    where a peer is ahead (by at least 0.005), worst first, with that peer."""
    from pykda.bench import decode

    def row(batch, hq, hkv, kv_len, d, us, peers):
        return dict(batch=batch, hq=hq, hkv=hkv, kv_len=kv_len, D=d, us=us,
                    peers={n: dict(us=p, err=0.0) for n, p in peers.items()})
    rows = [row(1, 32, 8, 17, 64, 6.2, {"fi": 5.3, "cudnn": 5.8}), row(1, 32, 32, 8192, 128, 39.0, {"cudnn": 42.0}),
            row(256, 64, 8, 513, 128, 101.0, {"fi-tc": 99.0, "fi": 194.6}), row(1, 8, 1, 1, 64, 6.0, {"fi": 5.99})]
    line = decode.grid_summary(rows)
    assert line.startswith("grid: 4 shapes; best peer µs / pykda µs: worst 0.85 (32/8 S=17 D=64), median 0.99 over 4")
    assert line.endswith("; a peer ahead on 2: 32/8 S=17 D=64 0.85 (fi), 64/8 S=513 B=256 D=128 0.98 (fi-tc)")


def test_paged_grid_summary_names_the_rows_flashinfer_leads(monkeypatch):
    """A line per page size; each names the rows where FlashInfer's faster path leads, with it."""
    from pykda.bench import paged_decode
    monkeypatch.setattr(paged_decode, "GRID_PAGES", (16, 1))

    def row(batch, kv_len, us16, us1, fi16, fitc16, fi1):
        return {"batch": batch, "hq": 32, "hkv": 8, "kv_len": kv_len, "D": 128, "padded": 10.0, "paged_16": us16,
                "paged_1": us1, "fi_16": fi16, "fi-tc_16": fitc16, "fi_1": fi1, "fi-tc_1": None}
    lines = paged_decode.grid_summary([row(4, 65536, 10.0, 10.0, 9.0, 9.8, 11.0), row(8, 32768, 10.0, 12.0, 20.0, None, 13.0)])
    assert lines[0].endswith("median 1.45 over 2 shapes; a peer ahead on 1: 4x32/8:65536 D=128 0.90 (fi)")
    assert lines[1].endswith("median 1.09 over 2 shapes") and "ahead" not in lines[1]


@needs_torch
def test_max_seconds_stops_taking_shapes_and_still_writes_what_ran(decode_on_cpu, bench_main, monkeypatch, capsys):
    """--max-seconds: once spent (a clock that moves 10 s a shape here), the bench takes no more
    shapes, says how far it got, and prints and writes the rows it measured; a run without it
    takes every shape (the limit of an earlier run does not stay)."""
    from pykda.bench import decode, timing
    now = [0.0]
    monkeypatch.setattr(timing.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(timing, "_deadline", None)   # restored after the test, whatever the runs below leave

    def reference_of(*args):   # once a shape
        now[0] += 10.0
        return _reference_of(*args)
    monkeypatch.setattr(decode, "float64_outputs", reference_of)
    shapes = ["--shapes", "4/2:16,4/2:24,4/2:32,4/2:40"]
    rows, out = bench_main(["bench", "decode", *shapes, "--max-seconds", "15"], capsys)
    assert [r["kv_len"] for r in rows] == [16, 24]
    assert "--max-seconds spent: stopped after 2 of 4 shapes" in out
    assert "NHD us" in out and "wrote " in out
    rows, out = bench_main(["bench", "decode", *shapes], capsys)
    assert [r["kv_len"] for r in rows] == [16, 24, 32, 40] and "stopped" not in out


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_max_seconds_must_be_a_positive_number(value, capsys):
    with pytest.raises(SystemExit):
        cli(["bench", "decode", "--max-seconds", value])
    assert "is not a number of seconds above 0" in capsys.readouterr().err


def test_in_time_has_the_length_of_its_items_for_the_progress_bar(monkeypatch):
    from pykda.bench import timing
    monkeypatch.setattr(timing, "_deadline", None)
    items = timing.in_time(iter([(1, "a"), (2, "b")]), "cases")
    assert len(items) == 2 and list(items) == [(1, "a"), (2, "b")]


class _FakeFlashInfer:
    """flashinfer's decode entry points as recorders (float64 reference outputs are not needed:
    the benches only time them and read their outputs' errors)."""

    def __init__(self):
        self.calls = []
        fake = self

        class Wrapper:
            def __init__(self, workspace, kv_layout, use_tensor_cores=False):
                fake.calls.append(("wrapper", kv_layout, use_tensor_cores))

            def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
                fake.calls.append(("plan", indptr.tolist(), indices.tolist(), last_page_len.tolist(), num_qo_heads,
                                   num_kv_heads, head_dim, page_size, kw))

            def run(self, q, kv):
                fake.calls.append(("run", tuple(q.shape), tuple(kv[0].shape)))
                return q
        self.BatchDecodeWithPagedKVCacheWrapper = Wrapper

    def single_decode_with_kv_cache(self, q, k, v, kv_layout="NHD", use_tensor_cores=False):
        self.calls.append(("single", tuple(k.shape), kv_layout, use_tensor_cores))
        return q


@needs_torch
def test_flashinfer_peers_read_the_same_hnd_buffers(monkeypatch):
    """A single sequence through single_decode_with_kv_cache (HND), a batch through the paged
    wrapper with one page of S rows per sequence and its length as the last page's; both paths."""
    from pykda.bench import decode
    fi = _FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: None)   # the wrapper's workspace
    q, k = torch.empty(1, 8, 64), torch.empty(1, 2, 100, 64)
    peers = decode._flashinfer_peers(q, k, k, None, False)
    assert set(peers) == {"fi", "fi-tc"} and fi.calls == [("single", (2, 100, 64), "HND", False),
                                                         ("single", (2, 100, 64), "HND", True)]
    fi.calls.clear()
    q, k = torch.empty(3, 8, 64), torch.empty(3, 2, 100, 64)
    decode._flashinfer_peers(q, k, k, [100, 7, 1], True)
    plans = [c for c in fi.calls if c[0] == "plan"]
    assert [c for c in fi.calls if c[0] == "wrapper"] == [("wrapper", "HND", False), ("wrapper", "HND", True)]
    assert plans[0][1:8] == ([0, 1, 2, 3], [0, 1, 2], [100, 7, 1], 8, 2, 64, 100)


@needs_torch
@pytest.mark.parametrize("layout, heads_at", [("NHD", 2), ("HND", 1)])
def test_flashinfer_paged_peer_gets_the_page_table(monkeypatch, layout, heads_at):
    from pykda.bench import paged_decode
    fi = _FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: None)
    q = torch.empty(2, 8, 64)
    pages = torch.empty(4, 16, 2, 64) if layout == "NHD" else torch.empty(4, 2, 16, 64)
    fn = paged_decode._flashinfer_paged(q, pages, pages, [0, 2, 4], torch.tensor([3, 1, 0, 2]), [16, 16], layout, 16)
    assert fn is not None
    (plan,) = [c for c in fi.calls if c[0] == "plan"]
    assert plan[1:8] == ([0, 2, 4], [3, 1, 0, 2], [16, 16], 8, 2, 64, 16)
    assert ("wrapper", layout, False) in fi.calls


def test_flashinfer_paged_peer_is_absent_without_flashinfer(monkeypatch):
    from pykda.bench import paged_decode
    monkeypatch.setitem(sys.modules, "flashinfer", None)   # import flashinfer raises ImportError
    assert paged_decode._flashinfer_paged(None, None, None, [0], [], [], "NHD", 16) is None


def _rows_of_pages(pages, indptr, indices, lens, b):
    """Request b's first lens[b] rows [Hkv, n, D] gathered from HND pages [P, Hkv, page, D] by its table."""
    idx = torch.as_tensor(indices)[indptr[b]:indptr[b + 1]].long()
    hkv, page, d = pages.shape[1:]
    return pages[idx].transpose(0, 1).reshape(hkv, -1, d)[:, :lens[b]]


@needs_torch
@pytest.mark.parametrize("page", [16, 1, 5])
def test_shuffled_pages_hold_each_requests_rows(page):
    """Request b's pages, read in the table's order, hold its first lens[b] rows of K and of V
    (one table for both); its last page holds kv_last_page_len[b] of them; the pool is a
    permutation (pages shuffled)."""
    from pykda.bench import paged_decode
    x, y = torch.randn(3, 2, 37, 4), torch.randn(3, 2, 37, 4)
    lens = [37, 5, 16]
    (pages, y_pages), indptr, indices, last = paged_decode.shuffled_pages((x, y), lens, page, seed=3)
    n = [-(-length // page) for length in lens]
    assert indptr.tolist() == [0, n[0], n[0] + n[1], sum(n)] and pages.shape == (sum(n), 2, page, 4)
    assert sorted(indices.tolist()) == list(range(sum(n)))
    if page > 1:
        assert indices.tolist() != list(range(sum(n))), "shuffled"
    assert last.tolist() == [length - (k - 1) * page for length, k in zip(lens, n)]
    for b in range(3):
        assert torch.equal(_rows_of_pages(pages, indptr, indices, lens, b), x[b, :, :lens[b]])
        assert torch.equal(_rows_of_pages(y_pages, indptr, indices, lens, b), y[b, :, :lens[b]]), "one table for both"


@needs_torch
def test_paged_grid_rows_against_flashinfer_and_padded(decode_on_cpu, bench_main, monkeypatch, capsys):
    """--grid: the decode grid's batched rows only, pykda's paged run on each page size against
    FlashInfer's two paths on the same pages and the padded kernel, errors against float64 and a
    summary line per page size."""
    from pykda.bench import paged_decode
    monkeypatch.setattr(paged_decode, "GRID", [(1, 4, 2, 8, 16, False), (3, 4, 1, 8, 24, True), (2, 4, 2, 16, 20, False)])
    monkeypatch.setattr(paged_decode, "GRID_PAGES", (16, 1))
    monkeypatch.setattr(paged_decode, "float64_outputs", _reference_of)
    monkeypatch.setattr(paged_decode, "flash_decode", _flash_decode_stub([]))
    monkeypatch.setattr(paged_decode.timing, "start", lambda flush="read": (_Timer(), 4.0))

    class Paged:   # pykda's paged run as float64 over the rows its table names
        def __init__(self, layout):
            assert layout == "HND"

        def plan(self, indptr, indices, last, hq, hkv, d, page):
            self.table = (indptr, indices, [(k - 1) * page + n for k, n in zip(np.diff(indptr), last)])

        def run(self, q, k_pages, v_pages):
            indptr, indices, lens = self.table
            rows = [[_rows_of_pages(x, indptr, indices, lens, b).transpose(0, 1)[None] for x in (k_pages, v_pages)]
                    for b in range(len(lens))]
            return torch.from_numpy(np.concatenate([_reference_of(q[b:b + 1], k, v) for b, (k, v) in enumerate(rows)]))
    monkeypatch.setattr(paged_decode, "BatchDecodeWithPagedKVCache", Paged)
    seen = []

    def fake_fi(q, k_pages, v_pages, indptr, indices, last, layout, page, tensor_cores=False):
        seen.append((page, tensor_cores, layout))
        if tensor_cores and page == 1:
            return None   # a call FlashInfer refuses: '-'
        dec = Paged(layout)
        dec.plan(indptr, indices, last, q.shape[1], k_pages.shape[1], q.shape[2], page)
        return lambda: dec.run(q, k_pages, v_pages)
    monkeypatch.setattr(paged_decode, "_flashinfer_paged", fake_fi)
    rows, out = bench_main(["bench", "paged-decode", "--grid"], capsys)
    assert [(r["batch"], r["D"], r["uneven"]) for r in rows] == [(3, 8, True), (2, 16, False)]
    assert set(seen) == {(p, tc, "HND") for p in (16, 1) for tc in (False, True)}
    for r in rows:
        for page in (16, 1):
            assert r[f"err_{page}"] < 1e-2 and r[f"err_fi_{page}"] < 1e-2 and r[f"paged_{page}"] == 10.0
        assert r["fi-tc_1"] is None and r["err_fi-tc_1"] is None and r["err_padded"] < 1e-2
    assert "paged grid, pages of 16: 2 shapes; paged / padded µs 1.00-1.00; FlashInfer µs / pykda µs: worst 1.00" in out
    assert "paged grid, pages of 1: 2 shapes" in out and "median 1.00 over 2 shapes" in out
