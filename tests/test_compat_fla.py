"""pykda.compat.fla offline (skipped without fla >= 0.6): registered with fla's dispatch, fla's own
`chunk_kda` and `fused_recurrent_kda_fwd` reach pykda's ops with fla's arguments and meanings
(the calls of fla's KimiDeltaAttention layer and of a serving step run pykda's real host path to
its launches on a stubbed GPU); autograd, and what pykda's validation refuses, stay on fla's own
kernels with the arguments as given."""
import inspect
import logging
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla.backends", reason="fla (fla-core >= 0.6, with backend dispatch) is not importable")

import fla.backends  # noqa: E402
import fla.ops.kda  # noqa: E402
from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd  # noqa: E402

from pykda.compat import fla as compat  # noqa: E402
from pykda.ops import kda, kda_decode  # noqa: E402
from pykda.runtime.device import DeviceInfo  # noqa: E402
from test_host_overhead import _driver_reads, cpu_twin_of_arrays, stubbed_gpu  # noqa: E402

B, T, H, K = 1, 40, 2, 64
bf = torch.bfloat16


def registries():
    return (fla.backends._function_registries[inspect.unwrap(fla.ops.kda.chunk_kda)],
            fla.backends._operation_registries["kda"])


@pytest.fixture
def registered(monkeypatch):
    """pykda registered for this test only (fla has no unregister: its registries' entries are
    removed after), with FLA_PYKDA unset."""
    monkeypatch.delenv("FLA_PYKDA", raising=False)
    compat.register()
    compat.DECLINED.seen.clear()
    yield
    for r in registries():
        r._backends.pop(compat.BACKEND_TYPE, None)


@pytest.fixture
def fla_kernels(monkeypatch):
    """fla's own functions (the fallbacks) replaced by recorders: [(name, args, kwargs)]."""
    log = []

    def recorder(name):
        def run(*args, **kwargs):
            log.append((name, args, kwargs))
            return "fla's o", "fla's state"
        return staticmethod(run)
    monkeypatch.setattr(compat.ChunkKdaBackend, "_fla", recorder("chunk_kda"))
    monkeypatch.setattr(compat.RecurrentKdaBackend, "_fla", recorder("fused_recurrent_kda_fwd"))
    return log


def tokens(heads_v=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    return dict(q=rnd(B, T, H, K).to(bf), k=rnd(B, T, H, K).to(bf), v=rnd(B, T, heads_v, K).to(bf),
                g=rnd(B, T, heads_v, K).to(bf), beta=rnd(B, T, heads_v).to(bf))


def layer_flags(A_log, dt_bias):
    """The keywords fla's KimiDeltaAttention layer passes chunk_kda (fla/layers/kda.py, 0.6)."""
    return dict(A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, allow_neg_eigval=False, safe_gate=False, lower_bound=None,
                state_v_first=True)


def test_registered_ahead_of_flash_kda_once_and_switched_off_by_fla_pykda(registered, monkeypatch):
    compat.register()   # again: one entry per registry
    chunk_reg, op_reg = registries()
    assert [b.backend_type for b in chunk_reg._get_sorted_backends()].count("pykda") == 1
    order = [b.backend_type for b in chunk_reg._get_sorted_backends()]
    if "flash_kda" in order:
        assert order.index("pykda") < order.index("flash_kda")
    ours = [b for b in op_reg._get_sorted_backends() if b.backend_type == "pykda"]
    assert len(ours) == 1 and ours[0].get_implementation("fused_recurrent_kda_fwd") is not None
    assert ours[0].get_implementation("chunk_kda_fwd_intra") is None   # fla's other dispatched KDA functions stay fla's
    assert all(b.is_enabled() for b in ours)
    monkeypatch.setenv("FLA_PYKDA", "0")
    assert not any(b.is_enabled() for b in ours)


def test_the_layers_prefill_reaches_pykda_with_fla_meanings(registered, monkeypatch):
    """fla's chunk_kda under no_grad, as fla's layer calls it, becomes pykda's call with every
    argument as given but A_log and dt_bias in fp32 (a bf16 model's parameters; fla reads them as
    fp32); without the gate in the kernel they are dropped, as fla ignores them there."""
    seen = []
    monkeypatch.setattr(compat, "_chunk_kda", lambda *a, **kw: seen.append((a, kw)) or ("o", "s"))
    x = tokens()
    A_log, dt_bias = torch.randn(H).to(bf), torch.randn(H * K)
    s0 = torch.zeros(B, H, K, K)
    cu, cu_cpu = torch.tensor([0, 15, 40]), torch.tensor([0, 15, 40])
    with torch.no_grad():
        assert fla.ops.kda.chunk_kda(**x, initial_state=s0, output_final_state=True, cu_seqlens=cu,
                                     cu_seqlens_cpu=cu_cpu, **layer_flags(A_log, dt_bias)) == ("o", "s")
    args, kw = seen[-1]
    assert [a is x[n] for a, n in zip(args, "q k v g beta".split())] == [True] * 5
    assert kw["A_log"].dtype == torch.float32 and torch.equal(kw["A_log"], A_log.float())
    assert kw["dt_bias"] is dt_bias   # fp32 already: no copy
    assert kw["initial_state"] is s0 and kw["cu_seqlens"] is cu and kw["cu_seqlens_cpu"] is cu_cpu
    assert kw["state_v_first"] is True and kw["use_gate_in_kernel"] is True and kw["output_final_state"] is True
    with torch.no_grad():
        fla.ops.kda.chunk_kda(**tokens(), A_log=A_log, dt_bias=dt_bias, chunk_size=32)   # precomputed g
    args, kw = seen[-1]
    assert kw["A_log"] is None and kw["dt_bias"] is None and kw["chunk_size"] == 32
    assert kw["cu_seqlens_cpu"] is None
    with torch.inference_mode():   # varlen checkpoints without the host copy: made here, as fla makes its own
        fla.ops.kda.chunk_kda(**x, cu_seqlens=cu, return_intermediate_states=True)
    args, kw = seen[-1]
    assert torch.equal(kw["cu_seqlens_cpu"], cu) and kw["cu_seqlens"] is cu   # (.cpu() of a CPU tensor: itself)


def test_autograd_stays_on_fla(registered):
    """pykda has no backward: a call autograd would record is refused before pykda runs."""
    x = tokens()
    backend = compat.ChunkKdaBackend()
    assert backend.verify("chunk_kda", *x.values()) == (True, None)
    x["q"].requires_grad_(True)
    ok, why = backend.verify("chunk_kda", *x.values())
    assert not ok and "no backward" in why
    with torch.no_grad():
        assert backend.verify("chunk_kda", *x.values()) == (True, None)
    x["q"].requires_grad_(False)
    A_log = torch.randn(H, requires_grad=True)   # a parameter alone is enough
    assert not backend.verify("chunk_kda", *x.values(), A_log=A_log)[0]


def test_devices_other_than_sm90_stay_on_fla(registered, monkeypatch):
    """pykda's kernels are built for sm_90a: on any other CUDA device both entry points stay fla's."""
    gpu_q = types.SimpleNamespace(is_cuda=True, get_device=lambda: 3, requires_grad=False)
    x = tokens()
    for capability, ok in (((8, 0), False), ((10, 0), False), ((9, 0), True)):
        info = DeviceInfo(3, "GPU", capability, 132, 232448, 233472, 60 << 20)
        monkeypatch.setattr(compat.runtime, "device_info", lambda device, info=info: info if device == 3 else None)
        chunk = compat.ChunkKdaBackend().verify("chunk_kda", gpu_q, *list(x.values())[1:])
        step = compat.RecurrentKdaBackend().verify("fused_recurrent_kda_fwd", gpu_q, *list(x.values())[1:])
        assert chunk[0] is step[0] is ok
        if not ok:
            assert chunk[1] == step[1] and chunk[1].startswith("pykda's kernels run on Hopper GPUs (compute capability "
                                                               "9.0") and \
                f"device 3 (GPU) has compute capability {capability[0]}.{capability[1]}" in chunk[1]


def test_the_layers_prefill_runs_pykdas_launches(registered, fla_kernels):
    """End to end on the stubbed GPU: fla's chunk_kda with the layer's keywords goes through
    pykda's validation and plan to its two launches, and returns pykda's output and new final
    state; fla's kernels are not called."""
    twin = cpu_twin_of_arrays()
    x = tokens()
    s0 = torch.randn(B, H, K, K)
    with stubbed_gpu(twin), torch.no_grad():
        seen = _driver_reads(kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE)
        o, final = fla.ops.kda.chunk_kda(**x, initial_state=s0, output_final_state=True,
                                         **layer_flags(torch.randn(H), torch.randn(H * K)))
    assert fla_kernels == [] and len(seen) == 2
    assert tuple(o.shape) == (B, T, H, K) and o.dtype == bf
    assert tuple(final.shape) == (B, H, K, K) and final.dtype == torch.float32 and final is not s0
    assert seen[1][1][6] == o.data_ptr() and seen[1][1][10] == s0.data_ptr() and seen[1][1][11] == final.data_ptr()


def test_what_pykda_refuses_runs_on_fla_as_given(registered, fla_kernels, caplog):
    """Grouped value heads (HV > H), which pykda's validation refuses before anything is made or
    launched: fla's own chunk_kda runs the call with its arguments as given (A_log not cast),
    and the reason is logged once."""
    twin = cpu_twin_of_arrays()
    x = tokens(heads_v=2 * H)
    A_log = torch.randn(2 * H).to(bf)
    with stubbed_gpu(twin) as gpu, torch.no_grad(), caplog.at_level(logging.INFO, logger=compat.logger.name):
        seen = _driver_reads(kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE)
        for _ in range(2):
            assert fla.ops.kda.chunk_kda(**x, **layer_flags(A_log, None)) == ("fla's o", "fla's state")
    assert seen == [] and gpu.scratch == []
    assert len(fla_kernels) == 2
    name, args, kw = fla_kernels[0]
    assert name == "chunk_kda" and args[2] is x["v"] and kw["A_log"] is A_log and kw["use_gate_in_kernel"] is True
    declined = [r.getMessage() for r in caplog.records if r.name == compat.logger.name]
    assert len(declined) == 1 and "grouped value heads" in declined[0] and "chunk_kda" in declined[0]


def decode_step(state_dtype=torch.float32, seed=1):
    """A serving step as engines call fla's fused_recurrent_kda_fwd: one token for each of 3
    sequences, Kimi Linear's gate, β logits, rows of a V-first pool (one padding slot)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    N = 3
    x = dict(q=rnd(N, 1, H, K).to(bf), k=rnd(N, 1, H, K).to(bf), v=rnd(N, 1, H, K).to(bf), g=rnd(N, 1, H, K).to(bf),
             beta=rnd(N, 1, H).to(bf), A_log=rnd(H), dt_bias=rnd(H * K))
    pool = rnd(5, H, K, K).to(state_dtype)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True)
    return x, pool, torch.tensor([4, -1, 0], dtype=torch.int32), flags


def test_the_serving_step_advances_the_pool_in_place_on_pykda(registered, fla_kernels):
    twin = cpu_twin_of_arrays()
    x, pool, idx, flags = decode_step()
    with stubbed_gpu(twin):
        seen = _driver_reads(kda_decode.KERNEL_SIGNATURE)
        o, final = fused_recurrent_kda_fwd(**x, initial_state=pool, inplace_final_state=True,
                                           ssm_state_indices=idx, **flags)
    assert fla_kernels == [] and len(seen) == 1 and final is pool
    assert tuple(o.shape) == tuple(x["v"].shape)
    params = seen[0][1]
    assert params[:5] == [x[n].data_ptr() for n in ("q", "k", "g", "v", "beta")]


def test_flas_out_of_place_step_reads_the_states_and_writes_new_ones_on_pykda(registered, fla_kernels):
    """fla's public fused_recurrent_kda (its layer's decode) asks for new final states
    (inplace_final_state=False): pykda runs it as a target verify of the one token, the start
    states only read (the kernel's state write off) and the state after the token into a new
    fp32 array, slot n for sequence n."""
    twin = cpu_twin_of_arrays()
    x, pool, _, flags = decode_step()
    s0 = pool[:3].clone()
    with stubbed_gpu(twin):
        seen = _driver_reads(kda_decode.KERNEL_SIGNATURE)
        o, final = fused_recurrent_kda_fwd(**x, initial_state=s0, inplace_final_state=False, output_final_state=True,
                                           **flags)
        o2, none = fused_recurrent_kda_fwd(**x, initial_state=s0, inplace_final_state=False, **flags)
    assert fla_kernels == [] and len(seen) == 2 and none is None
    assert tuple(final.shape) == tuple(s0.shape) and final.dtype == torch.float32 and final is not s0
    assert tuple(o.shape) == tuple(x["v"].shape)
    params = seen[0][1]
    assert params[8] == s0.data_ptr() and params[11] == 0   # the start states, row n for sequence n
    assert params[22] == final.data_ptr() and params[25:28] == [1, 3, 0]   # one step, 3 slots; the pool not written
    assert seen[1][1][22] == 0 and seen[1][1][27] == 0   # no final states asked for: nothing written but o


def out_of_place_case(case):
    """decode_step's inputs reshaped for a case of fla's out-of-place step, and its start states."""
    x, pool, idx, flags = decode_step(state_dtype=torch.bfloat16 if case == "bf16 states" else torch.float32)
    s0 = None if case == "no initial state" else pool[:3].clone()
    if case in ("two tokens", "two tokens over pool rows"):
        x.update({n: torch.cat([x[n], x[n]], dim=1) for n in ("q", "k", "v", "g", "beta")})
    if case == "two tokens over pool rows":
        s0, flags["ssm_state_indices"] = pool, idx
    if case == "packed":
        x.update({n: x[n].transpose(0, 1) for n in ("q", "k", "v", "g", "beta")})
        flags["cu_seqlens"] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    return x, s0, flags


@pytest.mark.parametrize("case", ["two tokens", "packed", "no initial state"])
def test_flas_out_of_place_steps_of_several_tokens_run_as_pykdas_prefill(registered, fla_kernels, case):
    """Out of place, anything but one token a sequence from start states (several tokens: fla's
    layer runs prompts of up to 64 tokens so; packed tokens; zero start states) is pykda's
    chunk_kda of the tokens: it reads the start states and makes new fp32 final ones."""
    twin = cpu_twin_of_arrays()
    x, s0, flags = out_of_place_case(case)
    with stubbed_gpu(twin):
        seen = _driver_reads(kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE)
        o, final = fused_recurrent_kda_fwd(**x, initial_state=s0, inplace_final_state=False, output_final_state=True,
                                           **flags)
    assert fla_kernels == [] and len(seen) == 2
    assert tuple(o.shape) == tuple(x["v"].shape) and final.dtype == torch.float32 and tuple(final.shape) == (3, H, K, K)
    rec = seen[1][1]
    assert rec[10] == (0 if s0 is None else s0.data_ptr()) and rec[11] == final.data_ptr()


@pytest.mark.parametrize("case", ["bf16 states", "two tokens over pool rows"])
def test_flas_out_of_place_steps_pykda_does_not_run_stay_on_fla(registered, fla_kernels, caplog, case):
    """Out of place, bf16 start states (fla's new final states are fp32, pykda's keep the start
    states' dtype) and several tokens over pool rows (fla then stores every token's state) go to
    fla's kernel with the arguments as given."""
    twin = cpu_twin_of_arrays()
    x, s0, flags = out_of_place_case(case)
    with stubbed_gpu(twin), caplog.at_level(logging.INFO, logger=compat.logger.name):
        seen = _driver_reads(kda_decode.KERNEL_SIGNATURE)
        r = fused_recurrent_kda_fwd(**x, initial_state=s0, inplace_final_state=False, output_final_state=True,
                                    **flags)
    assert r == ("fla's o", "fla's state") and seen == []
    name, args, kw = fla_kernels[0]
    assert name == "fused_recurrent_kda_fwd" and kw["inplace_final_state"] is False
    assert kw["output_final_state"] is True and kw["initial_state"] is s0 and args[0] is x["q"]
    assert any("pykda declined" in r.getMessage() for r in caplog.records)
