"""CPU tests of `python -m pykda demo`: the continuous-batching plan, the offline path, and the
GPU path's data flow end to end on torch CPU tensors, the three ops replaced by float64
references that honour their documented contracts (pool rows by state_indices, -1 as padding,
has_initial_state, cu_seqlens, kv_lens, out=), at small head counts."""
import numpy as np
import pytest

try:
    import torch
except ImportError:   # the GPU path's CPU run needs torch (CPU is enough); the rest does not
    torch = None

import pykda
from pykda import demo, reference, runtime
from pykda.runtime.device import DeviceInfo


def plan():
    requests = demo.make_requests()
    return requests, demo.schedule(requests)


def test_schedule_is_continuous_batching():
    requests, steps = plan()
    assert len(steps) == demo.STEPS and steps[0].joins == tuple(steps[0].slots)
    for index, step in enumerate(steps):
        live = [r for r in step.slots if r is not None]
        assert all(r.live(index) and step.slots[r.slot] is r for r in live)
        assert len({r.row for r in live}) == len(live) and all(0 <= r.row < demo.POOL_ROWS for r in live)
        assert all(r.position(index) < demo.CACHE_LEN for r in live)
        for r in step.joins:   # a joiner takes a slot and a pool row that nobody live holds
            assert r.join == index and step.slots[r.slot] is r
            if index:
                before = steps[index - 1].slots[r.slot]
                assert before is None or not before.live(index)
                assert all(p.row != r.row for p in steps[index - 1].slots if p is not None and p.live(index))
    joined = [r for s in steps[1:] for r in s.joins]
    assert joined and any(r.row_after is not None for r in joined), "slots and pool rows get reused"
    assert any(r is None for r in steps[-1].slots), "an empty slot (padding) at the end"
    checked = demo.checked_requests(steps)
    assert [r.join == 0 for r in checked] == [True, False]
    assert all(r.live(demo.STEPS - 1) for r in checked) and checked[1].row_after is not None


def test_slot_meta_pads_empty_slots():
    requests, steps = plan()
    meta = demo.slot_meta(demo.STEPS - 1, steps[-1])
    for i, r in enumerate(steps[-1].slots):
        if r is None:
            assert tuple(meta[:, i]) == (-1, 0, 0)
        else:
            assert tuple(meta[:, i]) == (r.row, r.position(demo.STEPS - 1), r.position(demo.STEPS - 1) + 1)


def test_kernel_specs_cover_every_family():
    from pykda.registry import H200_SMEM_PER_SM, H200_SMS
    _, steps = plan()
    specs = demo.kernel_specs(steps, "sm_90a", H200_SMS, H200_SMEM_PER_SM)
    assert {s.template for s in specs} == {"kda_prepare", "kda_recurrence", "kda_scan", "kda_decode", "decode"}
    assert len(specs) == len(set(specs))


def test_offline_demo(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(runtime, "compile_specs", lambda specs: ((s, b"\x7fELF" + bytes(100), 0.01, False) for s in specs))
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU here" in out and "compiled" in out
    for template in ("kda_prepare", "kda_recurrence", "kda_decode", "decode "):
        assert template in out


@pytest.mark.skipif(torch is None, reason="the demo asks torch for its device")
def test_demo_on_a_gpu_it_does_not_support_shows_the_offline_compile(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "device_info", lambda i: DeviceInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912,
                                                                     167936, 40 << 20))
    monkeypatch.setattr(runtime, "compile_specs", lambda specs: ((s, b"\x7fELF" + bytes(100), 0.01, False) for s in specs))
    monkeypatch.setattr(demo, "run", lambda *a: pytest.fail("the GPU run started on an unsupported device"))
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "device 0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0" in out and "compiled" in out


def test_progress_without_and_with_tqdm(monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    assert list(demo.progress([1, 2], "stage", plain_lines=True)) == [1, 2]
    assert "stage [2/2] 2" in capsys.readouterr().out
    made = []   # an iterator with its count: each line as its item arrives, none made ahead

    def arriving():
        for i in (1, 2, 3):
            made.append(i)
            yield i
    lines = demo.progress(arriving(), "compile", plain_lines=True, total=3)
    assert next(lines) == 1 and made == [1] and capsys.readouterr().out == "compile [1/3] 1\n"
    assert list(lines) == [2, 3] and capsys.readouterr().out.splitlines()[-1] == "compile [3/3] 3"


# ------------------------------------------------------------------------------------------
# The GPU path on the CPU
# ------------------------------------------------------------------------------------------

needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch (the CPU build is enough)")
KIMI_FLAGS = dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  state_v_first=True)


def f64(t):
    return t.double().numpy()


def kda_ref(q, k, v, g, beta, A_log, dt_bias, s0, cu=None):
    return reference.kda_recurrent(f64(q), f64(k), f64(v), f64(g), f64(beta), A_log=f64(A_log),
                                   dt_bias=f64(dt_bias), initial_state=s0, cu_seqlens=cu, gate="softplus")


def fake_chunk_kda(q, k, v, g, beta, *, A_log, dt_bias, initial_state, state_indices, has_initial_state,
                   cu_seqlens, **flags):
    assert flags == KIMI_FLAGS and q.shape[0] == 1
    pool, rows = initial_state, state_indices.numpy()
    s0 = np.where(has_initial_state.numpy()[:, None, None, None], f64(pool[rows]), 0.0)
    o, s = kda_ref(q, k, v, g, beta, A_log, dt_bias, s0, cu_seqlens.numpy())
    for n, r in enumerate(rows):
        if 0 <= r < pool.shape[0]:
            pool[r] = torch.from_numpy(s[n])
    return torch.from_numpy(o).bfloat16(), None


def fake_fused_recurrent_kda(q, k, v, g, beta, *, A_log, dt_bias, initial_state, state_indices, out, **flags):
    assert flags == KIMI_FLAGS and out.shape == v.shape
    for b, r in enumerate(state_indices.tolist()):
        if r < 0:
            out[b] = 0
            continue
        o, s = kda_ref(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1], A_log, dt_bias,
                       f64(initial_state[r])[None])
        initial_state[r] = torch.from_numpy(s[0])
        out[b] = torch.from_numpy(o[0])
    return out, None


def fake_batch_decode(q, k, v, *, kv_lens, out):
    assert k.shape[0] == q.shape[0] and kv_lens.dtype == torch.int32
    for b, n in enumerate(kv_lens.tolist()):
        out[b] = 0 if n == 0 else torch.from_numpy(reference.decode_attention(f64(q[b]), f64(k[b, :n]),
                                                                              f64(v[b, :n]))[0])
    return out


class FakeGraph:
    def __init__(self, eng):
        self.eng = eng

    def replay(self):
        demo.decode_step(self.eng)


@pytest.fixture
def cpu_demo(monkeypatch):
    """demo.main() on the CPU: small heads, short prompts, the ops' fakes, no graph, no timers."""
    for name, value in dict(KDA_HEADS=2, KDA_DIM=64, ATTN_HEADS=4, ATTN_KV_HEADS=2, ATTN_DIM=64,
                            PROMPT_LENS=(3, 24), CACHE_LEN=48, DEVICE="cpu").items():
        monkeypatch.setattr(demo, name, value)
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(runtime, "device_info", lambda i: DeviceInfo(0, "CPU stand-in", (9, 0), 132, 232448,
                                                                       233472, 50 << 20))
    monkeypatch.setattr(runtime, "compile_specs", lambda specs: ((s, bytes(1000), 0.0, True) for s in specs))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(demo, "capture", lambda torch, eng: setattr(eng, "graph", FakeGraph(eng)))
    monkeypatch.setattr(demo, "gpu_us", lambda torch, fn, reps=20: (fn(), 10.0)[1])
    monkeypatch.setattr(demo, "wall_us", lambda torch, fn, reps=100: (fn(), 20.0)[1])
    monkeypatch.setattr(pykda, "chunk_kda", fake_chunk_kda)
    monkeypatch.setattr(pykda, "fused_recurrent_kda", fake_fused_recurrent_kda)
    monkeypatch.setattr(pykda, "batch_decode_with_padded_kv_cache", fake_batch_decode)
    return monkeypatch


@needs_torch
def test_gpu_path_data_flow_on_cpu(cpu_demo, capsys):
    assert demo.main() == 0
    out = capsys.readouterr().out
    assert "all checks pass" in out and "step " in out and "decode step, graph replay" in out
    assert out.count("state ") == 2 * 3 and out.count(" out ") == 2 * 4


@needs_torch
def test_check_catches_a_lost_decode_state(cpu_demo, capsys):
    """A decode that never writes the pool back fails the check (it is not vacuous)."""
    def forgetful(*args, initial_state, **kw):
        return fake_fused_recurrent_kda(*args, initial_state=initial_state.clone(), **kw)
    cpu_demo.setattr(pykda, "fused_recurrent_kda", forgetful)
    assert demo.main() == 1
    assert "CHECK FAILED" in capsys.readouterr().out


@needs_torch
def test_check_catches_a_kv_cache_not_appended(cpu_demo, capsys):
    real = demo.decode_layer

    def no_append(eng, layer):
        if layer.kind == "attn":
            return fake_batch_decode(layer.x["q"], layer.k_cache, layer.v_cache, kv_lens=eng.kv_lens, out=layer.o)
        return real(eng, layer)
    cpu_demo.setattr(demo, "decode_layer", no_append)
    assert demo.main() == 1
