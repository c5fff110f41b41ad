"""CPU tests of KDA prefill argument checks and planning (no GPU needed)."""
import numpy as np
import pytest

import pykda
from pykda import registry
from pykda.ops.kda import (KdaProblem, check_chunk_lower_bound, plan_kda, prepare_smem_bytes, record_bytes,
                           recurrence_smem_bytes, validate_kda)
from fakes import BASE, device_array as arr



def good(B=1, T=100, H=4, K=128):
    return dict(q=arr((B, T, H, K)), k=arr((B, T, H, K)), v=arr((B, T, H, K)), g=arr((B, T, H, K)),
                beta=arr((B, T, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
                initial_state=None, cu_seqlens=None, out=None, final_state=None, chunk_size=16, lower_bound=-5.0)


def check(**a):
    return validate_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], a["A_log"], a["dt_bias"], a["initial_state"],
                        a["cu_seqlens"], a["out"], a["final_state"], a["chunk_size"], a["lower_bound"])


def test_valid_problems_are_described():
    p = check(**good(B=2))
    assert (p.batch, p.seq_len, p.heads, p.head_dim, p.n_seq, p.varlen, p.chunk) == (2, 100, 4, 128, 2, False, 16)
    a = good(K=64)
    a.update(cu_seqlens=arr((8,), "int64"), initial_state=arr((7, 4, 64, 64), "bfloat16"),
             dt_bias=arr((4 * 64,), "float32"), chunk_size=32, lower_bound=-2.7)
    p = check(**a)
    assert (p.n_seq, p.varlen, p.state_dtype, p.chunk) == (7, True, "bfloat16", 32)


def test_strided_views_are_accepted():
    a = good()
    big = arr((1, 100, 4, 4, 128))   # q = qkvg[:, :, 0] of a packed [B, T, 4, H, K] tensor
    a["q"] = arr((1, 100, 4, 128), strides=(big.strides[0], big.strides[1], 128, 1))
    a["beta"] = arr((1, 100, 4), strides=(800, 8, 2))
    check(**a)


@pytest.mark.parametrize("case, exc, message", [
    ("q_dtype", TypeError, "q must have dtype bfloat16; got float16"),
    ("beta_dtype", TypeError, "beta must have dtype bfloat16; got float32"),
    ("v_dtype", TypeError, "v must have dtype bfloat16"),
    ("q_rank", ValueError, "q must be 4-D"),
    ("beta_rank", ValueError, "beta must be 3-D"),
    ("k_shape", ValueError, "k must have shape"),
    ("g_shape", ValueError, "g must have shape"),
    ("v_heads", ValueError, "v must be \\[B, T, H, V\\]"),
    ("v_dim", ValueError, "v's head dim V \\(64\\) must equal q's head dim K \\(128\\)"),
    ("k96", ValueError, "head dim K must be one of \\(64, 128\\); got 96"),
    ("beta_shape", ValueError, "beta must have shape"),
    ("A_log_dtype", TypeError, "A_log must have dtype float32"),
    ("A_log_shape", ValueError, "A_log must have shape \\[H\\]"),
    ("dt_bias_shape", ValueError, "dt_bias must have shape \\[H, K\\]"),
    ("dt_bias_dtype", TypeError, "dt_bias must have dtype float32"),
    ("cu_dtype", TypeError, "cu_seqlens must have dtype int32 or int64"),
    ("cu_rank", ValueError, "cu_seqlens must be 1-D"),
    ("cu_batch", ValueError, "with cu_seqlens the batch size B must be 1"),
    ("state_shape", ValueError, "initial_state must have shape \\[N, H, V, K\\] = \\(3, 4, 128, 128\\)"),
    ("state_shape_varlen", ValueError, "initial_state must have shape \\[N, H, V, K\\] = \\(5, 4, 128, 128\\)"),
    ("state_dtype", TypeError, "initial_state must have dtype float32 or bfloat16; got float16"),
    ("state_mismatch", TypeError, "final_state must have the dtype of initial_state"),
    ("final_shape", ValueError, "final_state must have shape"),
    ("chunk64", ValueError, "chunk_size must be one of \\(16, 32\\); got 64"),
    ("lb_chunk32", ValueError, "below -2.7, the limit for chunk_size=32"),
    ("lb_chunk16", ValueError, "below -5.5, the limit for chunk_size=16"),
    ("lb_positive", ValueError, "lower_bound must be finite and <= 0"),
    ("misaligned", ValueError, "k must start at a 16-byte aligned address"),
    ("inner", ValueError, "v must be contiguous in its last dimension"),
    ("stride16", ValueError, "g: stride 1004 of dim 2 is 2008 bytes"),
    ("out_dtype", TypeError, "out must have dtype bfloat16"),
    ("out_shape", ValueError, "out must have shape"),
    ("device", ValueError, "all arrays must be on one device"),
])
def test_bad_input_names_the_argument(case, exc, message):
    a = good(B=3)
    B, T, H, K = 3, 100, 4, 128
    if case == "q_dtype":
        a["q"] = arr((B, T, H, K), "float16")
    elif case == "beta_dtype":
        a["beta"] = arr((B, T, H), "float32")
    elif case == "v_dtype":
        a["v"] = arr((B, T, H, K), "float32")
    elif case == "q_rank":
        a["q"] = arr((T, H, K))
    elif case == "beta_rank":
        a["beta"] = arr((B, T, H, 1))
    elif case == "k_shape":
        a["k"] = arr((B, T + 1, H, K))
    elif case == "g_shape":
        a["g"] = arr((B, T, H, 64))
    elif case == "v_heads":
        a["v"] = arr((B, T, H + 1, K))
    elif case == "v_dim":
        a["v"] = arr((B, T, H, 64))
    elif case == "k96":
        for n in ("q", "k", "v", "g"):
            a[n] = arr((B, T, H, 96))
    elif case == "beta_shape":
        a["beta"] = arr((B, T, H + 1))
    elif case == "A_log_dtype":
        a["A_log"] = arr((H,), "bfloat16")
    elif case == "A_log_shape":
        a["A_log"] = arr((H, 1), "float32")
    elif case == "dt_bias_shape":
        a["dt_bias"] = arr((H, K + 1), "float32")
    elif case == "dt_bias_dtype":
        a["dt_bias"] = arr((H, K), "float64")
    elif case == "cu_dtype":
        a["cu_seqlens"] = arr((3,), "float32")
    elif case == "cu_rank":
        a["cu_seqlens"] = arr((3, 1), "int32")
    elif case == "cu_batch":
        a["cu_seqlens"] = arr((3,), "int32")
    elif case == "state_shape":
        a["initial_state"] = arr((1, H, K, K), "float32")
    elif case == "state_shape_varlen":
        for n in ("q", "k", "v", "g"):
            a[n] = arr((1, T, H, K))
        a["beta"] = arr((1, T, H))
        a["cu_seqlens"] = arr((6,), "int32")
        a["initial_state"] = arr((1, H, K, K), "float32")
    elif case == "state_dtype":
        a["initial_state"] = arr((B, H, K, K), "float16")
    elif case == "state_mismatch":
        a["initial_state"] = arr((B, H, K, K), "float32")
        a["final_state"] = arr((B, H, K, K), "bfloat16")
    elif case == "final_shape":
        a["final_state"] = arr((B, H, K, 64), "float32")
    elif case == "chunk64":
        a["chunk_size"] = 64
    elif case == "lb_chunk32":
        a.update(chunk_size=32, lower_bound=-5.0)
    elif case == "lb_chunk16":
        a["lower_bound"] = -6.0
    elif case == "lb_positive":
        a["lower_bound"] = 0.5
    elif case == "misaligned":
        a["k"] = arr((B, T, H, K), ptr=BASE + 8)
    elif case == "inner":
        a["v"] = arr((B, T, H, K), strides=(T * H * 2 * K, H * 2 * K, 2 * K, 2))
    elif case == "stride16":
        a["g"] = arr((B, T, H, K), strides=(T * H * 1004, H * 1004, 1004, 1))
    elif case == "out_dtype":
        a["out"] = arr((B, T, H, K), "float32")
    elif case == "out_shape":
        a["out"] = arr((B, T, H, 64))
    elif case == "device":
        a["v"] = arr((B, T, H, K), device=1)
    with pytest.raises(exc, match=message):
        check(**a)


def test_lower_bound_limits():
    assert check_chunk_lower_bound(-2.7, 32) == -2.7
    assert check_chunk_lower_bound(-5.0, 16) == -5.0
    assert check_chunk_lower_bound(0.0, 32) == 0.0
    with pytest.raises(ValueError, match="use chunk_size=16"):
        check_chunk_lower_bound(-3.0, 32)
    with pytest.raises(ValueError, match="finite"):
        check_chunk_lower_bound(float("nan"), 16)


def test_host_arrays_are_refused_by_name():
    z = np.zeros((1, 4, 1, 64), np.float32)
    with pytest.raises(TypeError, match="q must be a GPU array"):
        pykda.chunk_kda(z, z, z, z, np.zeros((1, 4, 1), np.float32), A_log=np.zeros(1, np.float32),
                        dt_bias=np.zeros((1, 64), np.float32))


# ---- planning ----
H200_SMS = 132


@pytest.mark.parametrize("B, T, H, K, N, varlen, warps", [
    (1, 8192, 64, 128, 1, False, 4),     # 64 heads x 2 splits = 128 CTAs
    (1, 8192, 96, 128, 1, False, 4),     # 96 x 2 = 192
    (1, 8192, 64, 128, 6, True, 8),      # 384 sequence-heads: no split needed
    (1, 32768, 8, 128, 1, False, 1),     # 8 x 8 = 64: as fine as it goes
    (1, 32768, 32, 128, 1, False, 2),    # 32 x 4 = 128
    (2, 100, 2, 64, 2, False, 1),
])
def test_plan_splits_v_to_fill_the_gpu(B, T, H, K, N, varlen, warps):
    p = KdaProblem(B, T, H, K, N, varlen, 16, "float32")
    plan = plan_kda(p, H200_SMS)
    assert plan.warps == warps and plan.v_split == 16 * warps and K % plan.v_split == 0
    ctas = N * H * (K // plan.v_split)
    assert ctas >= 0.9 * H200_SMS or plan.warps == 1


@pytest.mark.parametrize("lengths, C", [([1, 15, 16, 17, 0, 1000, 4099], 16), ([0, 0, 1], 32), ([33] * 9, 16)])
def test_chunk_slots_bound_the_varlen_chunk_count(lengths, C):
    T = sum(lengths)
    plan = plan_kda(KdaProblem(1, T, 2, 128, len(lengths), True, C, "float32"), H200_SMS)
    assert plan.chunk_slots >= sum(-(-n // C) for n in lengths)


def test_fixed_batch_slots_are_exact():
    plan = plan_kda(KdaProblem(3, 33, 2, 64, 3, False, 16, "float32"), H200_SMS)
    assert plan.chunk_slots == 3 * 3


def test_plan_overrides_are_checked():
    p = KdaProblem(1, 100, 2, 64, 1, False, 16, "float32")
    assert plan_kda(p, H200_SMS, warps=4, stages=2).stages == 2
    with pytest.raises(ValueError, match="warps"):
        plan_kda(p, H200_SMS, warps=8)


def test_shared_memory_fits_an_h200_block():
    for K in (64, 128):
        for C in (16, 32):
            assert record_bytes(K, C) % 16 == 0
            assert prepare_smem_bytes(K, C) <= 227 * 1024
            for w in (1, 2, 4, 8):
                stages = 4 if C == 16 else 3
                assert recurrence_smem_bytes(K, C, w, stages) <= 227 * 1024


def test_kda_family_is_registered():
    specs = registry.specs("kda", "sm_90a")
    templates = {s.template for s in specs}
    assert templates == {"kda_prepare", "kda_recurrence"}
    rec = [s.param_dict for s in specs if s.template == "kda_recurrence"]
    assert {(r["K"], r["C"], r["WARPS"]) for r in rec} >= {(128, 16, w) for w in (1, 2, 4, 8)}


# ---- the launch sequence, offline: fake device, workspace and kernels ----
class _FakeKernel:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def launch(self, grid, block, args, smem, stream):
        from pykda.runtime.launch import param_layout
        param_layout(args)   # every argument has a kernel parameter type
        self.log.append((self.name, grid, block, smem, args))


@pytest.fixture
def offline(monkeypatch):
    from pykda import runtime
    from pykda.ops import kda
    from pykda.runtime.device import DeviceInfo
    log = []
    info = DeviceInfo(0, "fake H200", (9, 0), 132, 232448, 233472, 60 << 20)
    monkeypatch.setattr(runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(runtime, "device_info", lambda i: info)
    monkeypatch.setattr(runtime, "workspace", lambda d, s, n: 1 << 32)
    monkeypatch.setattr(runtime, "get_kernel", lambda spec, dev, name: _FakeKernel(name, log))
    monkeypatch.setattr(runtime, "encode_tiled", lambda *a, **k: bytes(128))
    monkeypatch.setattr(kda, "as_device_array", lambda x, name: x)
    monkeypatch.setattr(kda, "launch_stream", lambda ref, stream=None: 0)
    monkeypatch.setattr(kda, "to_framework", lambda ref, x: x)
    monkeypatch.setattr(kda, "empty_like_framework", lambda ref, shape, dtype: arr(shape, dtype, ptr=BASE * 2))
    return log


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("state", [None, "float32", "bfloat16"])
def test_launch_sequence_offline(offline, varlen, state):
    B, T, H, K = (1, 100, 4, 128) if varlen else (2, 100, 4, 128)
    N = 3 if varlen else B
    a = good(B=B, T=T, H=H, K=K)
    cu = arr((N + 1,), "int64") if varlen else None
    s0 = arr((N, H, K, K), state) if state else None
    o, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"], dt_bias=a["dt_bias"],
                            initial_state=s0, output_final_state=state is not None, cu_seqlens=cu)
    names = [entry[0] for entry in offline]
    assert names == (["kda_chunk_offsets"] if varlen else []) + ["kda_prepare", "kda_recurrence"]
    prep, rec = offline[-2], offline[-1]
    assert prep[1] == ((T // 16 + 1 + N) if varlen else B * 7, H, 1)
    warps = rec[2][0] // 32 - 1
    assert rec[1] == (K // (16 * warps), H, N)
    assert tuple(o.shape) == (B, T, H, K)
    assert (fs is None) == (state is None)
    if state:
        assert fs.dtype == state and tuple(fs.shape) == (N, H, K, K)
