"""CPU tests of KDA prefill argument checks and planning (no GPU needed)."""
import math

import numpy as np
import pytest

import pykda
from pykda import registry
from pykda.ops.kda import (WGMMA_CHAINS_SHARE, KdaProblem, bounded_gate, kda_specs, plan_kda, prepare_smem_bytes,
                           record_bytes, recurrence_smem_bytes, validate_kda)
from pykda.ops.kda_variant import SAFE_GATE_FLAGS, KdaFlags, KdaVariant, resolve_variant
from fakes import BASE, device_array as arr, offline_runtime

# Kimi Linear's gate: -exp(A_log) * softplus(g + dt_bias), no lower bound
SOFTPLUS_FLAGS = KdaFlags(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
# vLLM's form: g is the log-decay, beta probabilities (fp32 both)
PRECOMPUTED_FLAGS = KdaFlags(use_qk_l2norm_in_kernel=True)
ARGS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "state_indices", "has_initial_state",
        "cu_seqlens", "out", "final_state", "flags", "state_v_first", "chunk_size")


def good(B=1, T=100, H=4, K=128):
    return dict(q=arr((B, T, H, K)), k=arr((B, T, H, K)), v=arr((B, T, H, K)), g=arr((B, T, H, K)),
                beta=arr((B, T, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
                initial_state=None, state_indices=None, has_initial_state=None, cu_seqlens=None, out=None,
                final_state=None, flags=SAFE_GATE_FLAGS, state_v_first=True, chunk_size=16)


def check(**a):
    return validate_kda(*(a[n] for n in ARGS))


def with_lower_bound(a, lower_bound):
    a["flags"] = a["flags"]._replace(lower_bound=lower_bound)
    return a


def call_kwargs(a):
    """validate_kda's arguments as chunk_kda's keywords."""
    kw = {n: a[n] for n in ARGS[5:13] + ("state_v_first", "chunk_size")}
    return dict(kw, **a["flags"]._asdict())


def problem(B, T, H, K, N, varlen, C=16, state="float32"):
    variant = KdaVariant("softplus", "logit", True, "bfloat16", "bfloat16", 0.0)
    return KdaProblem(B, T, H, K, N, varlen, C, state, variant, False, N)


def test_valid_problems_are_described():
    p = check(**good(B=2))
    assert (p.batch, p.seq_len, p.heads, p.head_dim, p.n_seq, p.varlen, p.chunk) == (2, 100, 4, 128, 2, False, 16)
    assert p.variant == KdaVariant("safe", "logit", True, "bfloat16", "bfloat16", -5.0)
    assert (p.v_first, p.pool_rows) == (True, 2)
    a = with_lower_bound(good(K=64), -2.7)
    a.update(cu_seqlens=arr((8,), "int64"), initial_state=arr((7, 4, 64, 64), "bfloat16"),
             dt_bias=arr((4 * 64,), "float32"), chunk_size=32)
    p = check(**a)
    assert (p.n_seq, p.varlen, p.state_dtype, p.chunk, p.pool_rows) == (7, True, "bfloat16", 32, 7)


def test_strided_views_are_accepted():
    a = good()
    big = arr((1, 100, 4, 4, 128))   # q = qkvg[:, :, 0] of a packed [B, T, 4, H, K] tensor
    a["q"] = arr((1, 100, 4, 128), strides=(big.strides[0], big.strides[1], 128, 1))
    a["beta"] = arr((1, 100, 4), strides=(800, 8, 2))
    check(**a)


def test_heads_broadcast_from_one_are_accepted():
    """q, k and g of one head read by every head (a stride of 0 over H, as torch's expand makes):
    kda_prepare takes each array's strides, so nothing needs a copy."""
    a = good()
    for n in ("q", "k", "g"):
        a[n] = arr((1, 100, 4, 128), strides=(100 * 128, 128, 0, 1))
    check(**a)


# each bad input: (case, exception, message naming the argument)
BAD = [
    ("q_dtype", TypeError, "q must have dtype bfloat16; got float16"),
    ("beta_dtype", TypeError, "beta must have dtype bfloat16 or float32; got float16"),
    ("beta_fp64", TypeError, "beta must have dtype bfloat16 or float32; got float64"),
    ("g_dtype", TypeError, "g must have dtype bfloat16 or float32; got float16"),
    ("v_dtype", TypeError, "v must have dtype bfloat16"),
    ("q_rank", ValueError, "q must be 4-D"),
    ("beta_rank", ValueError, "beta must be 3-D"),
    ("k_shape", ValueError, "k must have shape"),
    ("g_shape", ValueError, "g must have shape"),
    ("v_heads", ValueError, "v has 5 heads and q 4: grouped value heads \\(HV > H\\) are not supported"),
    ("v_len", ValueError, "v must be \\[B, T, H, V\\]"),
    ("v_dim", ValueError, "v's head dim V \\(64\\) must equal q's head dim K \\(128\\)"),
    ("k96", ValueError, "head dim K must be one of \\(64, 128\\); got 96"),
    ("beta_shape", ValueError, "beta must have shape"),
    ("A_log_dtype", TypeError, "A_log must have dtype float32; got bfloat16"),
    ("A_log_size", ValueError, "A_log must hold H = 4 elements \\(e.g. \\[H\\] or \\[1, 1, H, 1\\]\\); got shape \\(5,\\)"),
    ("A_log_size_2d", ValueError, "A_log must hold H = 4 elements .*; got shape \\(4, 2\\)"),
    ("A_log_strided", ValueError, "A_log must be contiguous"),
    ("dt_bias_size", ValueError, "dt_bias must hold H\\*K = 512 elements \\(\\[H, K\\] or \\[H\\*K\\]\\); got shape \\(4, 129\\)"),
    ("dt_bias_dtype", TypeError, "dt_bias must have dtype float32; got float64"),
    ("dt_bias_misaligned", ValueError, "dt_bias must start at a 16-byte aligned address"),
    ("A_log_without_gate", ValueError, "A_log is given but use_gate_in_kernel=False"),
    ("dt_bias_without_gate", ValueError, "dt_bias is given but use_gate_in_kernel=False"),
    ("softplus_without_A_log", ValueError, "use_gate_in_kernel=True without lower_bound .* needs A_log"),
    ("safe_gate_without_lower_bound", ValueError, "safe_gate=True with use_gate_in_kernel=True needs lower_bound"),
    ("neg_eigval_without_sigmoid", ValueError, "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    ("cu_dtype", TypeError, "cu_seqlens must have dtype int32 or int64"),
    ("cu_rank", ValueError, "cu_seqlens must be 1-D"),
    ("cu_batch", ValueError, "with cu_seqlens the batch size B must be 1"),
    ("state_shape", ValueError, "initial_state must have shape \\[N, H, V, K\\] = \\(3, 4, 128, 128\\)"),
    ("state_shape_k_first", ValueError, "initial_state must have shape \\[N, H, K, V\\] = \\(3, 4, 128, 128\\)"),
    ("state_shape_varlen", ValueError, "initial_state must have shape \\[N, H, V, K\\] = \\(5, 4, 128, 128\\)"),
    ("state_dtype", TypeError, "initial_state must have dtype float32 or bfloat16; got float16"),
    ("state_mismatch", TypeError, "final_state must have the dtype of initial_state"),
    ("final_shape", ValueError, "final_state must have shape"),
    ("indices_without_state", ValueError, "state_indices picks rows of the state pool: pass the pool as initial_state"),
    ("indices_with_final_state", ValueError, "with state_indices .* final_state must not be given"),
    ("indices_dtype", TypeError, "state_indices must have dtype int32 or int64; got float32"),
    ("indices_shape", ValueError, "state_indices must have shape \\[N\\] \\(one pool row per sequence\\) = \\(3,\\); got \\(4,\\)"),
    ("indices_rank", ValueError, "state_indices must have shape .*; got \\(3, 1\\)"),
    ("indices_strided", ValueError, "state_indices must be contiguous"),
    ("indices_device", ValueError, "all arrays must be on one device"),
    ("pool_rank", ValueError, "initial_state must be 4-D \\[P, H, V, K\\]"),
    ("pool_shape", ValueError, "initial_state must have shape \\[P, H, V, K\\] = \\(8, 4, 128, 128\\)"),
    ("has_initial_dtype", TypeError, "has_initial_state must have dtype bool; got int32"),
    ("has_initial_shape", ValueError, "has_initial_state must have shape \\[N\\] = \\(3,\\); got \\(4,\\)"),
    ("has_initial_rank", ValueError, "has_initial_state must have shape .*; got \\(3, 1\\)"),
    ("has_initial_strided", ValueError, "has_initial_state must be contiguous"),
    ("chunk48", ValueError, "chunk_size must be one of \\(16, 32\\).*got 48"),
    ("lb_positive", ValueError, "lower_bound must be finite and <= 0; got 0.5"),
    ("lb_nan", ValueError, "lower_bound must be finite and <= 0; got nan"),
    ("lb_inf", ValueError, "lower_bound must be finite and <= 0; got -inf"),
    ("misaligned", ValueError, "k must start at a 16-byte aligned address"),
    ("inner", ValueError, "v must be contiguous in its last dimension"),
    ("stride16", ValueError, "g: stride 1004 of dim 2 is 2008 bytes"),
    ("out_dtype", TypeError, "out must have dtype bfloat16"),
    ("out_shape", ValueError, "out must have shape"),
    ("device", ValueError, "all arrays must be on one device"),
]


def bad_args(case):
    """good(B=3) with the one change of `case`."""
    a = good(B=3)
    B, T, H, K = 3, 100, 4, 128
    if case == "q_dtype":
        a["q"] = arr((B, T, H, K), "float16")
    elif case == "beta_dtype":
        a["beta"] = arr((B, T, H), "float16")
    elif case == "beta_fp64":
        a["beta"] = arr((B, T, H), "float64")
    elif case == "g_dtype":
        a["g"] = arr((B, T, H, K), "float16")
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
    elif case == "v_len":
        a["v"] = arr((B, T + 1, H, K))
    elif case == "v_dim":
        a["v"] = arr((B, T, H, 64))
    elif case == "k96":
        for n in ("q", "k", "v", "g"):
            a[n] = arr((B, T, H, 96))
    elif case == "beta_shape":
        a["beta"] = arr((B, T, H + 1))
    elif case == "A_log_dtype":
        a["A_log"] = arr((H,), "bfloat16")
    elif case == "A_log_size":
        a["A_log"] = arr((H + 1,), "float32")
    elif case == "A_log_size_2d":
        a["A_log"] = arr((H, 2), "float32")
    elif case == "A_log_strided":
        a["A_log"] = arr((H,), "float32", strides=(2,))
    elif case == "dt_bias_size":
        a["dt_bias"] = arr((H, K + 1), "float32")
    elif case == "dt_bias_dtype":
        a["dt_bias"] = arr((H, K), "float64")
    elif case == "dt_bias_misaligned":
        a["dt_bias"] = arr((H, K), "float32", ptr=BASE + 4)
    elif case == "A_log_without_gate":
        a.update(flags=PRECOMPUTED_FLAGS, dt_bias=None)
    elif case == "dt_bias_without_gate":
        a.update(flags=PRECOMPUTED_FLAGS, A_log=None)
    elif case == "softplus_without_A_log":
        a.update(flags=SOFTPLUS_FLAGS, A_log=None)
    elif case == "safe_gate_without_lower_bound":
        a["flags"] = SAFE_GATE_FLAGS._replace(lower_bound=None)
    elif case == "neg_eigval_without_sigmoid":
        a["flags"] = SAFE_GATE_FLAGS._replace(use_beta_sigmoid_in_kernel=False, allow_neg_eigval=True)
    elif case == "cu_dtype":
        a["cu_seqlens"] = arr((3,), "float32")
    elif case == "cu_rank":
        a["cu_seqlens"] = arr((3, 1), "int32")
    elif case == "cu_batch":
        a["cu_seqlens"] = arr((3,), "int32")
    elif case == "state_shape":
        a["initial_state"] = arr((1, H, K, K), "float32")
    elif case == "state_shape_k_first":
        a.update(state_v_first=False, initial_state=arr((B, H, K, 64), "float32"))
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
    elif case == "indices_without_state":
        a["state_indices"] = arr((B,), "int32")
    elif case == "indices_with_final_state":
        a.update(initial_state=arr((8, H, K, K), "float32"), state_indices=arr((B,), "int32"),
                 final_state=arr((B, H, K, K), "float32"))
    elif case.startswith("indices_") or case.startswith("pool_"):
        a.update(initial_state=arr((8, H, K, K), "float32"), state_indices=arr((B,), "int32"))
        if case == "indices_dtype":
            a["state_indices"] = arr((B,), "float32")
        elif case == "indices_shape":
            a["state_indices"] = arr((B + 1,), "int32")
        elif case == "indices_rank":
            a["state_indices"] = arr((B, 1), "int32")
        elif case == "indices_strided":
            a["state_indices"] = arr((B,), "int32", strides=(2,))
        elif case == "indices_device":
            a["state_indices"] = arr((B,), "int32", device=1)
        elif case == "pool_rank":
            a["initial_state"] = arr((8, H, K * K), "float32")
        elif case == "pool_shape":
            a["initial_state"] = arr((8, H, K, 64), "float32")
    elif case == "has_initial_dtype":
        a["has_initial_state"] = arr((B,), "int32")
    elif case == "has_initial_shape":
        a["has_initial_state"] = arr((B + 1,), "bool")
    elif case == "has_initial_rank":
        a["has_initial_state"] = arr((B, 1), "bool")
    elif case == "has_initial_strided":
        a["has_initial_state"] = arr((B,), "bool", strides=(2,))
    elif case == "chunk48":
        a["chunk_size"] = 48
    elif case == "lb_positive":
        with_lower_bound(a, 0.5)
    elif case == "lb_nan":
        with_lower_bound(a, float("nan"))
    elif case == "lb_inf":
        with_lower_bound(a, -math.inf)
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
    else:
        raise AssertionError(f"unknown case {case}")
    return a


@pytest.mark.parametrize("case, exc, message", BAD)
def test_bad_input_names_the_argument(case, exc, message):
    with pytest.raises(exc, match=message):
        check(**bad_args(case))


@pytest.mark.parametrize("case, exc, message", BAD)
def test_chunk_kda_refuses_bad_input_before_any_launch(offline, case, exc, message):
    """The same bad inputs through chunk_kda's keywords: the same error, nothing launched."""
    a = bad_args(case)
    with pytest.raises(exc, match=message):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    assert offline == []


@pytest.mark.parametrize("keyword, value, message", [
    ("cp_context", object(), "cp_context \\(fla's context parallelism\\) is not supported"),
    ("checkpoint_every", 64, "checkpoint_every is given without return_intermediate_states"),
])
def test_unsupported_fla_keywords_are_refused(offline, keyword, value, message):
    a = good()
    with pytest.raises(ValueError, match=message):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), **{keyword: value})
    assert offline == []


def test_fla_only_keywords_are_accepted_and_change_nothing(offline):
    a = good()
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    plain = [entry[:4] for entry in offline]
    offline.clear()
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a),
                    disable_recompute=True, use_graph=True, max_num_seqs=7, cp_context=None,
                    return_intermediate_states=False)
    assert [entry[:4] for entry in offline] == plain


@pytest.mark.parametrize("shape", [(4,), (1, 1, 4, 1), (4, 1), (1, 4)])
def test_A_log_of_any_shape_with_H_elements_is_accepted(shape):
    for flags in (SAFE_GATE_FLAGS, SOFTPLUS_FLAGS):
        a = good()
        a.update(A_log=arr(shape, "float32"), flags=flags)
        assert check(**a).variant.gate == ("safe" if flags is SAFE_GATE_FLAGS else "softplus")


@pytest.mark.parametrize("shape", [(4 * 128,), (4, 128), (1, 1, 4, 128)])
def test_dt_bias_of_any_shape_with_HK_elements_is_accepted(shape):
    a = good()
    a["dt_bias"] = arr(shape, "float32")
    check(**a)


@pytest.mark.parametrize("g_dtype, beta_dtype", [("float32", "float32"), ("float32", "bfloat16"),
                                                 ("bfloat16", "float32")])
def test_fp32_g_and_beta_are_accepted(g_dtype, beta_dtype):
    a = good(B=2)
    a.update(g=arr((2, 100, 4, 128), g_dtype), beta=arr((2, 100, 4), beta_dtype), flags=PRECOMPUTED_FLAGS,
             A_log=None, dt_bias=None)
    p = check(**a)
    assert p.variant == KdaVariant("none", "prob", True, g_dtype, beta_dtype, 0.0)
    a.update(flags=SOFTPLUS_FLAGS, A_log=arr((1, 1, 4, 1), "float32"), dt_bias=arr((4 * 128,), "float32"))
    assert check(**a).variant == KdaVariant("softplus", "logit", True, g_dtype, beta_dtype, 0.0)


@pytest.mark.parametrize("flags, expected", [
    (SAFE_GATE_FLAGS, ("safe", "logit", True, -5.0)),
    (SOFTPLUS_FLAGS, ("softplus", "logit", True, 0.0)),
    (PRECOMPUTED_FLAGS, ("none", "prob", True, 0.0)),
    (KdaFlags(), ("none", "prob", False, 0.0)),
    (KdaFlags(use_gate_in_kernel=True, lower_bound=-3.0), ("safe", "prob", False, -3.0)),   # safe_gate optional
    (KdaFlags(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
     ("softplus", "logit2", False, 0.0)),
    (KdaFlags(use_beta_sigmoid_in_kernel=True), ("none", "logit", False, 0.0)),
])
def test_flags_resolve_to_the_variant(flags, expected):
    gate_args = (arr((4,), "float32"), arr((4, 128), "float32")) if flags.use_gate_in_kernel else (None, None)
    v = resolve_variant(flags, arr((1, 5, 4, 128)), arr((1, 5, 4)), *gate_args, 4, 128)
    assert (v.gate, v.beta, v.norm, v.lower_bound) == expected
    assert v.template_params()["GATE"] == {"safe": 0, "softplus": 1, "none": 2}[expected[0]]


def test_safe_gate_needs_no_A_log():
    """lower_bound · sigmoid(g + dt_bias) without A_log (exp(A_log) = 1), and without dt_bias."""
    a = good()
    a.update(A_log=None, dt_bias=None)
    assert check(**a).variant.gate == "safe"


@pytest.mark.parametrize("C", [16, 32])
@pytest.mark.parametrize("lower_bound", [0.0, -2.7, -5.0, -6.0, -50.0])
def test_any_lower_bound_fits_either_chunk_size(C, lower_bound):
    """The chunked form has no growth factor: no lower-bound limit per chunk size any more
    (chunk_size=32 used to refuse lower_bound < -2.7, chunk_size=16 below -5.5)."""
    a = with_lower_bound(good(), lower_bound)
    a["chunk_size"] = C
    p = check(**a)
    assert (p.chunk, p.variant.lower_bound) == (C, lower_bound)


@pytest.mark.parametrize("flags, C, bounded", [
    (SAFE_GATE_FLAGS, 16, True),                                   # -5 · 16 · log2(e) = -115 >= -120
    (SAFE_GATE_FLAGS, 32, False),                                  # -231: chunks may need the growth-free form
    (SAFE_GATE_FLAGS._replace(lower_bound=-2.5), 32, True),
    (SAFE_GATE_FLAGS._replace(lower_bound=-5.5), 16, False),
    (SOFTPLUS_FLAGS, 16, False),                                   # unbounded
    (PRECOMPUTED_FLAGS, 16, False),
])
def test_only_a_bounded_gate_skips_the_growth_free_form(flags, C, bounded):
    """kda_prepare compiles only its growth-factor form where the gate bounds a chunk's decay."""
    a = good()
    a.update(flags=flags, chunk_size=C)
    if not flags.use_gate_in_kernel:
        a.update(A_log=None, dt_bias=None)
    p = check(**a)
    assert bounded_gate(p) is bounded
    plan = plan_kda(p, H200_SMS)
    assert plan.prep_smem >= prepare_smem_bytes(128, C)


def test_state_layouts():
    a = good(B=2, K=64)
    a.update(initial_state=arr((2, 4, 64, 64), "float32"), state_v_first=False)
    assert check(**a).v_first is False
    a["state_v_first"] = True
    assert check(**a).v_first is True


@pytest.mark.parametrize("P", [2, 3, 16])
def test_a_state_pool_of_any_rows_is_accepted(P):
    """state_indices picks each sequence's row of a pool [P, ...] (rows >= P read as padding)."""
    a = good(B=1)
    a.update(cu_seqlens=arr((4,), "int32"), initial_state=arr((P, 4, 128, 128), "bfloat16"),
             state_indices=arr((3,), "int64"), has_initial_state=arr((3,), "bool"))
    p = check(**a)
    assert (p.n_seq, p.pool_rows, p.state_dtype) == (3, P, "bfloat16")


def test_host_arrays_are_refused_by_name():
    z = np.zeros((1, 4, 1, 64), np.float32)
    with pytest.raises(TypeError, match="q must be a GPU array"):
        pykda.chunk_kda(z, z, z, z, np.zeros((1, 4, 1), np.float32), A_log=np.zeros(1, np.float32),
                        dt_bias=np.zeros((1, 64), np.float32), **SAFE_GATE_FLAGS._asdict())
    a = good()
    a.update(initial_state=arr((2, 4, 128, 128), "float32"), state_indices=np.zeros(1, np.int32))
    with pytest.raises(TypeError, match="state_indices must be a GPU array"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))


# ---- planning ----
H200_SMS = 132


@pytest.mark.parametrize("B, T, H, K, N, varlen, warps", [
    (1, 8192, 64, 128, 1, False, 4),     # 64 heads x 2 splits = 128 CTAs
    (1, 8192, 96, 128, 1, False, 8),     # 96 chains on wgmma (73 % of the SMs) beat 96 x 4 = 384 CTAs
    (1, 8192, 88, 128, 1, False, 2),     # 88 chains (67 %): 88 x 2 = 176 fills 44 SMs twice: 88 x 4 = 352
    (1, 8192, 96, 64, 1, False, 2),      # no wgmma at K 64: 96 x 2 = 192 CTAs
    (2, 8192, 96, 128, 2, False, 8),     # 2 x 96 chains on wgmma: not halved to 4 warps
    (2, 8192, 48, 128, 2, False, 8),     # 2 x 48 = 96 chains: the share counts sequences x heads
    (1, 8192, 40, 128, 1, False, 2),     # 40 x 4 = 160: 1 warp would even it out, but is not tried
    (1, 8192, 64, 128, 6, True, 8),      # 384 sequence-heads: no split needed
    (1, 32768, 8, 128, 1, False, 1),     # 8 x 8 = 64: as fine as it goes
    (1, 32768, 32, 128, 1, False, 2),    # 32 x 4 = 128
    (2, 100, 2, 64, 2, False, 1),
])
def test_plan_splits_v_to_fill_the_gpu(B, T, H, K, N, varlen, warps):
    p = problem(B, T, H, K, N, varlen)
    plan = plan_kda(p, H200_SMS, segment_chunks=0)
    assert plan.warps == warps and plan.v_split == 16 * warps and K % plan.v_split == 0
    ctas = N * H * (K // plan.v_split)
    assert ctas >= 0.9 * H200_SMS or plan.warps == 1 or (plan.wgmma and ctas >= WGMMA_CHAINS_SHARE * H200_SMS)
    assert plan.wgmma == (plan.warps == 8 and K == 128)


@pytest.mark.parametrize("K, C, seg, warps, wgmma", [
    (128, 16, 64, 4, True),     # segment passes, a warpgroup: wgmma
    (128, 16, 64, 8, True),
    (128, 16, 64, 2, False),    # half a warpgroup: mma.sync
    (128, 16, 0, 4, False),     # one warpgroup walking a chain: mma.sync's shorter latency
    (128, 16, 0, 8, True),      # two warpgroups walking it: wgmma's fewer instructions
    (128, 16, 0, 2, False),
    (64, 16, 64, 4, False),     # shapes ptxas would serialize on wgmma
    (128, 32, 64, 4, False),
])
def test_plan_takes_wgmma_for_segments_and_warpgroup_pairs(K, C, seg, warps, wgmma):
    p = problem(1, 131072, 8, K, 1, False, C)
    plan = plan_kda(p, H200_SMS, warps=warps, segment_chunks=seg)
    assert plan.wgmma == wgmma
    specs = {s.param_dict["MAP"]: s.param_dict["WGMMA"] for s in kda_specs(p, plan, "sm_90a")[1:3]}
    assert set(specs.values()) == {wgmma}
    ckpt = kda_specs(p, plan, "sm_90a", checkpoints=True)[1].param_dict
    assert ckpt["CKPT"] and not ckpt["WGMMA"], "checkpoints: mma.sync"


@pytest.mark.parametrize("lengths, C", [([1, 15, 16, 17, 0, 1000, 4099], 16), ([0, 0, 1], 32), ([33] * 9, 16)])
def test_chunk_slots_bound_the_varlen_chunk_count(lengths, C):
    T = sum(lengths)
    plan = plan_kda(problem(1, T, 2, 128, len(lengths), True, C), H200_SMS)
    assert plan.chunk_slots >= sum(-(-n // C) for n in lengths)


def test_fixed_batch_slots_are_exact():
    plan = plan_kda(problem(3, 33, 2, 64, 3, False), H200_SMS)
    assert plan.chunk_slots == 3 * 3


def test_plan_overrides_are_checked():
    p = problem(1, 100, 2, 64, 1, False)
    assert plan_kda(p, H200_SMS, warps=4, stages=2).stages == 2
    with pytest.raises(ValueError, match="warps"):
        plan_kda(p, H200_SMS, warps=8)


def test_shared_memory_fits_an_h200_block():
    for K in (64, 128):
        for C in (16, 32):
            assert record_bytes(K, C) % 16 == 0
            # kda_prepare's MIN_CTAS: six CTAs an SM at C = 16 (1 KB a CTA reserved), three at C = 32
            assert (6 if C == 16 else 3) * (prepare_smem_bytes(K, C) + 1024) <= 228 * 1024
            for w in (1, 2, 4, 8):
                stages = 4 if C == 16 else 3
                assert recurrence_smem_bytes(K, C, w, stages) <= 227 * 1024


@pytest.mark.parametrize("lengths, H", [([131072] + [1024] * 63, 8), ([1300, 547, 2048, 963, 271, 3063], 64)])
def test_varlen_plans_split_only_sequences_longer_than_a_share(lengths, H):
    """With varlen the planner cannot see the lengths: a sequence of more than one SM's share of
    chunk·heads would split into thirds of a share; shorter ones (all of them, in the second
    batch) stay whole on the device."""
    p = problem(1, sum(lengths), H, 128, len(lengths), True)
    seg = plan_kda(p, H200_SMS).segments
    share = -(-(-(-sum(lengths) // 16) + len(lengths)) * H // H200_SMS)
    assert (seg.chunks, seg.split_above) == (max(64, share // 3), share)
    assert (max(lengths) // 16 > seg.split_above) is (H == 8)


@pytest.mark.parametrize("B, T, H, K, segmented", [
    (1, 32768, 8, 128, True),      # 8 heads x 8 splits: a chain of 2048 chunks on 64 warps
    (1, 65536, 16, 128, True),
    (1, 262144, 4, 128, True),
    (1, 32768, 32, 128, False),    # 256 warps of chains: V splits fill the GPU
    (1, 8192, 96, 128, False),
    (1, 300, 1, 128, False),       # too short to split
])
def test_plan_segments_where_the_chain_dominates(B, T, H, K, segmented):
    p = problem(B, T, H, K, B, False)
    seg = plan_kda(p, H200_SMS).segments
    assert bool(seg.chunks) is segmented
    if segmented:
        cps = -(-T // 16)
        assert seg.chunks == max(64, -(-cps // max(2, H200_SMS // (B * H)))), "one wave of segment-heads"
        per_seq = -(-cps // seg.chunks)
        assert seg.slots == B * per_seq and seg.map_slots == B * (per_seq - 1)
    assert not plan_kda(p, H200_SMS, segment_chunks=0).segments.chunks


def _disjoint_below(ranges, bound):
    """The [start, stop) ranges are in order, do not overlap, and end at or below `bound`."""
    end = 0
    for start, stop in ranges:
        assert start >= end and stop >= start
        end = max(end, stop)
    assert end <= bound


@pytest.mark.parametrize("seg", [1, 2, 3, 16, 1000])
@pytest.mark.parametrize("C", [16, 32])
def test_device_numbering_of_varlen_chunks_and_segments_fits_the_grids(seg, C):
    """kda_chunk.cuh numbers sequence n's chunk records from base(n) = floor(cu[n] / C) + n, its
    segments from floor(base(n) / seg) + n, its map slots from floor(base(n) / seg) and, if it can
    have 3 segments, its scan candidate index n or floor(base(n) / (2·seg + 1)), with no prefix sum: for
    any lengths (gaps before and after the sequences too) the ranges of the sequences never
    overlap and fit the planner's grids."""
    rng = np.random.default_rng(seg + C)
    for _ in range(100):
        lengths = rng.integers(0, 3000, size=rng.integers(1, 9)) * rng.integers(0, 2, size=1)
        lengths[rng.integers(0, len(lengths))] += rng.integers(0, 20000)
        lead, trail = rng.integers(0, 40, size=2)
        cu = lead + np.concatenate([[0], np.cumsum(lengths)])
        T = int(cu[-1] + trail)
        p = problem(1, T, 2, 128, len(lengths), True, C)
        plan = plan_kda(p, H200_SMS, segment_chunks=seg)
        chunks = [-(-int(n) // C) for n in lengths]
        base = [int(cu[n]) // C + n for n in range(len(lengths))]
        nseg = [max(1, -(-c // seg)) for c in chunks]
        _disjoint_below([(b, b + c) for b, c in zip(base, chunks)], plan.chunk_slots)
        _disjoint_below([(b // seg + n, b // seg + n + k) for n, (b, k) in enumerate(zip(base, nseg))],
                        plan.segments.slots)
        _disjoint_below([(b // seg, b // seg + k - 1) for b, k in zip(base, nseg)], plan.segments.map_slots)
        span, N = 2 * seg + 1, len(lengths)
        index = (lambda n, b: n) if plan.segments.scan_candidates == N else (lambda n, b: b // span)
        _disjoint_below([(index(n, b), index(n, b) + 1) for n, (b, k) in enumerate(zip(base, nseg)) if k >= 3],
                        plan.segments.scan_candidates)


@pytest.mark.parametrize("bad", [-1, 1.5, "4", True])
def test_bad_segment_chunks_is_named(bad):
    with pytest.raises(ValueError, match="segment_chunks must be a non-negative int"):
        plan_kda(problem(1, 4096, 2, 128, 1, False), H200_SMS, segment_chunks=bad)


def test_kda_family_is_registered():
    specs = registry.specs("kda", "sm_90a")
    templates = {s.template for s in specs}
    assert templates == {"kda_prepare", "kda_recurrence", "kda_scan"}
    rec = [s.param_dict for s in specs if s.template == "kda_recurrence"]
    assert {(r["K"], r["C"], r["WARPS"], r["MAP"]) for r in rec} >= {(128, 16, w, m) for w in (1, 2, 4, 8)
                                                                     for m in (False, True)}
    assert {r["VFIRST"] for r in rec} == {False, True}
    prep = [s.param_dict for s in specs if s.template == "kda_prepare"]
    assert {p["GATE"] for p in prep} == {0, 1, 2} and {p["BETA"] for p in prep} == {0, 1, 2}
    assert {(p["G_T"], p["BETA_T"]) for p in prep if p["GATE"] == 2} >= {("float", "float"), ("bf16_t", "bf16_t")}


# ---- the launch sequence, offline: fake device, workspace and kernels ----
WORKSPACE = 1 << 32


class _Log(list):
    """The launches, in order; `workspaces` the bytes of each workspace taken, `tmaps` the tensor
    maps encoded (name, dims, strides, box)."""
    workspaces: list
    tmaps: list


@pytest.fixture
def offline(monkeypatch):
    from pykda.ops import kda
    log = _Log()
    log.workspaces, log.tmaps = [], []

    def workspace(ref, stream, nbytes):
        log.workspaces.append(nbytes)
        return object(), WORKSPACE
    offline_runtime(monkeypatch, log, workspace, log.tmaps)
    kda.PREPARED.clear()   # prepared calls hold the fake kernels: none before, none left after
    yield log
    kda.PREPARED.clear()


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("state", [None, "float32", "bfloat16"])
def test_launch_sequence_offline(offline, varlen, state):
    B, T, H, K = (1, 100, 4, 128) if varlen else (2, 100, 4, 128)
    N = 3 if varlen else B
    a = good(B=B, T=T, H=H, K=K)
    cu = arr((N + 1,), "int64") if varlen else None
    s0 = arr((N, H, K, K), state) if state else None
    o, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"], dt_bias=a["dt_bias"],
                            **SAFE_GATE_FLAGS._asdict(), state_v_first=True, initial_state=s0,
                            output_final_state=state is not None, cu_seqlens=cu)
    names = [entry[0] for entry in offline]
    assert names == ["kda_prepare", "kda_recurrence"]   # sequences found from cu_seqlens on the device
    prep, rec = offline[-2], offline[-1]
    assert prep[1] == (H, 7 + N if varlen else B * 7, 1)   # heads fastest (few heads)
    warps = rec[2][0] // 32 - 1
    assert rec[1] == (K // (16 * warps), H, N)
    assert tuple(o.shape) == (B, T, H, K)
    assert (fs is None) == (state is None)
    if state:
        assert fs.dtype == state and tuple(fs.shape) == (N, H, K, K)


@pytest.mark.parametrize("varlen", [False, True])
def test_segmented_launch_sequence_offline(offline, varlen):
    """Segments: the prepare kernel, pass 1 (MAP, [B; M] rows: twice the V splits, one CTA row per
    map slot), the scan (16 rows per CTA, one per map slot) and pass 2 (one CTA row per segment);
    the workspace holds the records, then the maps."""
    B, T, H, K, seg = (1, 1000, 2, 128, 5) if varlen else (2, 1000, 2, 128, 5)
    N = 3 if varlen else B
    a = good(B=B, T=T, H=H, K=K)
    a["cu_seqlens"] = arr((N + 1,), "int32") if varlen else None
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), segment_chunks=seg, warps=4)
    names = [entry[0] for entry in offline]
    assert names == ["kda_prepare", "kda_recurrence", "kda_segment_scan", "kda_recurrence"]
    pass1, scan, pass2 = offline[-3:]
    assert pass1[5].param_dict["MAP"] is True and pass2[5].param_dict["MAP"] is False
    cps = -(-T // 16)
    chunks = cps + N if varlen else B * cps
    maps = -(-chunks // seg) if varlen else B * (-(-cps // seg) - 1)
    slots = maps + N if varlen else B * -(-cps // seg)
    assert pass1[1] == (2 * 2, H, maps) and pass2[1] == (2, H, slots)   # 64-row CTAs: 2 V splits
    candidates = min((cps + N) // (2 * seg + 1) + 1, N) if varlen else B   # sequences of 3 segments or more
    assert scan[1] == (K // 16 * candidates, H, 1) and scan[2] == (2 * K, 1, 1)
    seg_args = pass2[4][-7:-4]
    records = -(-chunks * H * record_bytes(K, 16) // 256) * 256
    assert seg_args == (seg, 0, WORKSPACE + records)   # every sequence longer than a segment splits
    assert offline.workspaces == [records + maps * H * 2 * K * K * 4]
    assert pass1[4] == pass2[4] and scan[4][2:5] == (WORKSPACE + records, seg, 0)
    # the scan's tensor maps: the slots' rows, boxes of 32 columns by K rows (M) and 16 (B)
    rows = maps * H * 2 * K
    assert [m for m in offline.tmaps if m[0] == "maps"] == [("maps", (K, rows), (4 * K,), (32, K)),
                                                           ("maps", (K, rows), (4 * K,), (32, 16))]


def test_two_level_scan_launch_sequence_offline(offline):
    """One head of a long sequence: the scan in two levels (scan_groups), three launches: every
    group's map ([B; M] rows, one CTA row a group), the groups' starts, every group's walk; each
    group has a slot after the map slots, covered by the scan's tensor maps."""
    from pykda.ops.kda import scan_groups
    B, T, H, K, seg = 2, 20000, 1, 128, 4
    a = good(B=B, T=T, H=H, K=K)
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), segment_chunks=seg)
    names = [entry[0] for entry in offline]
    assert names == ["kda_prepare", "kda_recurrence"] + ["kda_segment_scan"] * 3 + ["kda_recurrence"]
    per = -(-(-(-T // 16)) // seg)
    g, groups = scan_groups(per - 2, B * H * 2 * K // 16, 132)
    assert g and groups > 1 and (g - 1) * groups < per - 2 <= g * groups   # every step in one group
    total, starts, walk = offline[2:5]
    assert [s[5].param_dict["MODE"] for s in (total, starts, walk)] == ["group_total", "group_starts", "group_walk"]
    assert (total[1], starts[1], walk[1]) == ((2 * K // 16 * B, H, groups), (K // 16 * B, H, 1), (K // 16 * B, H, groups))
    map_slots = B * (per - 1)
    for launch in (total, starts, walk):
        assert launch[4][-4:-1] == (g, groups, map_slots)
    rows = (map_slots + B * groups) * H * 2 * K
    assert [m[1] for m in offline.tmaps if m[0] == "maps"] == [(K, rows)] * 2
    records = offline.workspaces[0] - rows * K * 4
    assert records > 0 and records % 256 == 0


@pytest.mark.parametrize("T, seg, nseg", [(1000, 5, 13), (1000, None, 1), (0, None, 1)])
def test_rank_slice_launch_sequence_offline(offline, T, seg, nseg):
    """A rank's slice: pass 1 maps every segment (RANK), the scan joins them into the slice's map,
    start_of turns it into the start state (before the last two launches), the scan of the starts
    and pass 2 follow; without segments the slice is one segment."""
    from pykda.ops.kda import chunk_kda_slice
    B, H, K = 2, 2, 128
    a = good(B=B, T=T, H=H, K=K)
    seen = []

    def start_of(total):
        seen.append((tuple(total.shape), total.dtype, [e[0] for e in offline]))
        return arr((B, H, K, K), "float32", ptr=BASE * 3)
    o, fs = chunk_kda_slice(a["q"], a["k"], a["v"], a["g"], a["beta"], start_of, A_log=a["A_log"],
                            dt_bias=a["dt_bias"], **SAFE_GATE_FLAGS._asdict(), output_final_state=True,
                            segment_chunks=seg, warps=4)
    names = [e[0] for e in offline]
    prep = ["kda_prepare"] if T else []
    assert names == prep + ["kda_recurrence", "kda_segment_scan", "kda_segment_scan", "kda_recurrence"]
    assert seen == [((B, H, 2 * K, K), "float32", prep + ["kda_recurrence", "kda_segment_scan"])]
    pass1, total, starts, pass2 = offline[-4:]
    assert [e[5].param_dict.get("RANK") for e in (pass1, pass2)] == [True, True]
    assert [e[5].param_dict["MODE"] for e in (total, starts)] == ["rank_total", "rank_starts"]
    assert pass1[1] == (4, H, B * nseg) and pass2[1] == (2, H, B * nseg)   # a map slot per segment
    assert total[1] == (2 * K // 16 * B, H, 1) and starts[1] == (K // 16 * B, H, 1)
    assert total[4][-1] == BASE * 2 and starts[4][-1] == BASE * 3   # the slice's map, then its start
    assert tuple(o.shape) == (B, T, H, K) and tuple(fs.shape) == (B, H, K, K)


@pytest.mark.parametrize("bad, exc, message", [
    (lambda B, H, K: arr((B, H, K, K), "bfloat16"), TypeError, "start_of's result must have dtype float32"),
    (lambda B, H, K: arr((B, H, 2 * K, K), "float32"), ValueError, "start_of's result must have shape"),
    (lambda B, H, K: arr((B, H, K, K), "float32", strides=(H * K * K, K * K, 1, K)), ValueError,
     "start_of's result must be contiguous"),
    (lambda B, H, K: arr((B, H, K, K), "float32", device=1), ValueError, "on q's device"),
])
def test_rank_slice_names_a_bad_start(offline, bad, exc, message):
    from pykda.ops.kda import chunk_kda_slice
    a = good(B=1, T=100, H=2, K=64)
    with pytest.raises(exc, match=message):
        chunk_kda_slice(a["q"], a["k"], a["v"], a["g"], a["beta"], lambda total: bad(1, 2, 64), A_log=a["A_log"],
                        dt_bias=a["dt_bias"], **SAFE_GATE_FLAGS._asdict())


def test_rank_slice_refuses_varlen():
    from pykda.ops.kda import prepare_chunk_kda
    a = good(B=1, T=100, H=2, K=64)
    a["cu_seqlens"] = arr((3,), "int32")
    with pytest.raises(ValueError, match="fixed-length sequences"):
        prepare_chunk_kda(*(a[n] for n in ARGS[:13]), None, None, tuple(SAFE_GATE_FLAGS), True, 16, None, None, None,
                          None, False, rank=True)


@pytest.mark.parametrize("varlen", [False, True])
def test_checkpoints_offline(offline, varlen):
    """return_intermediate_states: a new [B, ceil(T / E), H, K, K] buffer (varlen: [1, Σ ceil(len / E),
    ...] from cu_seqlens_cpu) in bf16 (fla's, whatever the states'), its pointer, E / C, its rows
    and its bf16 flag as the recurrence's last four arguments; the call returns it third."""
    B, T, H, K = (1, 1000, 2, 64) if varlen else (2, 1000, 2, 64)
    a = good(B=B, T=T, H=H, K=K)
    extra = {}
    if varlen:
        a["cu_seqlens"] = arr((4,), "int32")
        extra["cu_seqlens_cpu"] = [0, 100, 100, 1000]   # 2, 0 and 15 checkpoints of 64 tokens
    a["initial_state"] = arr((3 if varlen else B, H, K, K), "float32")
    o, fs, ckpt = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), **extra,
                                  output_final_state=True, return_intermediate_states=True)
    assert tuple(ckpt.shape) == ((1, 17) if varlen else (B, 16)) + (H, K, K)   # ceil(1000 / 64) = 16
    assert ckpt.dtype == "bfloat16"
    rec = offline[-1]
    assert rec[0] == "kda_recurrence" and rec[4][-4:] == (BASE * 2, 4, 17 if varlen else 32, 1)


def test_checkpoints_into_a_given_buffer_offline(offline):
    a = good(B=2, T=100, H=2, K=64)
    buf = arr((2, 4, 2, 64, 64), "float32", ptr=BASE * 5)   # every 32 tokens: ceil(100 / 32) = 4
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), intermediate_states=buf,
                    checkpoint_every=32)
    assert offline[-1][4][-4:] == (BASE * 5, 2, 8, 0)


def test_bf16_checkpoints_of_fp32_states_offline(offline):
    """fla's checkpoints are bf16 whatever the states' dtype: a bf16 buffer beside fp32 states
    sets the recurrence's bf16 flag (the states keep theirs)."""
    a = good(B=2, T=100, H=2, K=64)
    a["initial_state"] = arr((2, 2, 64, 64), "float32")
    buf = arr((2, 4, 2, 64, 64), "bfloat16", ptr=BASE * 5)
    o, fs, ckpt = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), output_final_state=True,
                                  intermediate_states=buf, checkpoint_every=32, return_intermediate_states=True)
    assert ckpt is buf and fs.dtype == "float32"
    assert offline[-1][4][-4:] == (BASE * 5, 2, 8, 1) and _recurrence_states(offline[-1])[2] == 0


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(checkpoint_every=24), ValueError, r"checkpoint_every must be a positive multiple of chunk_size \(16\)"),
    (dict(checkpoint_every=0), ValueError, "checkpoint_every must be a positive multiple"),
    (dict(checkpoint_every=64.0), ValueError, "checkpoint_every must be an int"),
    (dict(intermediate_states=arr((2, 3, 2, 64, 64), "float32")), ValueError,
     r"intermediate_states must have shape \[N, rows, H, V, K\] = \(2, 2, 2, 64, 64\)"),
    (dict(intermediate_states=arr((2, 2, 2, 64, 64), "float16")), TypeError,
     "intermediate_states must have dtype bfloat16 or float32; got float16"),
    (dict(intermediate_states=arr((2, 2, 64, 64), "float32")), ValueError, "intermediate_states must be 5-D"),
])
def test_bad_checkpoints_are_named_before_any_launch(offline, kwargs, exc, message):
    a = good(B=2, T=100, H=2, K=64)
    with pytest.raises(exc, match=message):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), return_intermediate_states=True,
                        **kwargs)
    assert offline == []


def test_varlen_checkpoints_need_the_lengths_on_the_host(offline):
    a = good(B=1, T=100, H=2, K=64)
    a["cu_seqlens"] = arr((3,), "int32")
    with pytest.raises(ValueError, match="needs cu_seqlens_cpu"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), return_intermediate_states=True)
    assert offline == []


@pytest.mark.parametrize("cu, every, rows", [([0, 100, 100, 1000], 64, 17), ([5, 3, 70], 16, 5), ([0, 2000], 64, 16)])
def test_checkpoint_rows_of_varlen_lengths(cu, every, rows):
    """Σ ceil(len / E) over the lengths the kernels see (clamped into [0, T], never negative)."""
    from pykda.ops.kda import checkpoint_rows
    assert checkpoint_rows(problem(1, 1000, 2, 64, len(cu) - 1, True), every, cu) == rows


def _prepare_args(entry):
    """kda_prepare's A_log and dt_bias pointers and its lower_bound (after q, k, g, beta's
    pointer and 3 strides each)."""
    args = entry[4]
    return args[16], args[17], float(args[-3])


@pytest.mark.parametrize("flags, gate_args, template, lower_bound", [
    (SAFE_GATE_FLAGS, True, dict(GATE=0, BETA=0, NORM=True), -5.0),
    (SOFTPLUS_FLAGS, True, dict(GATE=1, BETA=0, NORM=True), 0.0),
    (SOFTPLUS_FLAGS._replace(allow_neg_eigval=True), True, dict(GATE=1, BETA=1, NORM=True), 0.0),
    (PRECOMPUTED_FLAGS, False, dict(GATE=2, BETA=2, NORM=True, G_T="float", BETA_T="float"), 0.0),
])
def test_gate_modes_reach_the_kernels_offline(offline, flags, gate_args, template, lower_bound):
    """The variant is compiled into kda_prepare (template parameters) and A_log, dt_bias and
    lower_bound are passed only where the gate reads them."""
    a = good(B=2)
    if not gate_args:
        a.update(g=arr((2, 100, 4, 128), "float32"), beta=arr((2, 100, 4), "float32"))
    A_log = arr((1, 1, 4, 1), "float32", ptr=BASE * 3) if gate_args else None
    dt_bias = arr((4, 128), "float32", ptr=BASE * 4) if gate_args else None
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **flags._asdict(), A_log=A_log, dt_bias=dt_bias)
    prep = next(e for e in offline if e[0] == "kda_prepare")
    params = prep[5].param_dict
    assert {n: params[n] for n in template} == template
    assert params["BOUNDED"] is (flags.lower_bound is not None)   # chunk_size 16, lower_bound -5
    assert _prepare_args(prep) == ((BASE * 3, BASE * 4) if gate_args else (0, 0)) + (lower_bound,)
    rec = offline[-1]
    assert rec[5].param_dict["VFIRST"] is False   # fla's default layout


def _recurrence_states(entry):
    """kda_recurrence's initial and final state pointers, bf16 flag, index pointer, its int64
    flag, the pool rows, their stride and the has_initial_state pointer (the 8 arguments before the
    segments' and the checkpoints')."""
    return tuple(int(x) for x in entry[4][-15:-7])


@pytest.mark.parametrize("output_final_state", [False, True])
def test_pool_in_place_offline(offline, output_final_state):
    """With state_indices the states are read from and written back into the pool's rows: one
    pointer for both, the indices and the pool's row count passed; the pool is returned only
    when asked for."""
    H, K, P = 4, 128, 9
    a = good(B=1, H=H, K=K)
    pool = arr((P, H, K, K), "bfloat16", ptr=BASE * 5)
    idx, hi = arr((3,), "int64", ptr=BASE * 6), arr((3,), "bool", ptr=BASE * 7)
    o, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **SOFTPLUS_FLAGS._asdict(),
                            A_log=a["A_log"], dt_bias=a["dt_bias"], cu_seqlens=arr((4,), "int32"),
                            initial_state=pool, state_indices=idx, has_initial_state=hi,
                            output_final_state=output_final_state)
    rec = offline[-1]
    warps = rec[2][0] // 32 - 1
    assert rec[1] == (K // (16 * warps), 4, 3)   # one CTA per V split, head and sequence
    assert _recurrence_states(rec) == (BASE * 5, BASE * 5, 1, BASE * 6, 1, P, H * K * K, BASE * 7)
    assert (fs is pool) if output_final_state else (fs is None)


def test_pool_view_rows_offline(offline):
    """A pool that is a view of a larger cache (one slot's rows of several layers, as engines keep
    them): its rows are read and written in place at their own stride."""
    H, K, P = 4, 128, 9
    a = good(B=1, H=H, K=K)
    pool = arr((P, H, K, K), "float32", ptr=BASE * 5, strides=(3 * H * K * K, K * K, K, 1))
    idx = arr((3,), "int32", ptr=BASE * 6)
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **SOFTPLUS_FLAGS._asdict(), A_log=a["A_log"],
                    dt_bias=a["dt_bias"], cu_seqlens=arr((4,), "int32"), initial_state=pool, state_indices=idx)
    assert _recurrence_states(offline[-1])[:7] == (BASE * 5, BASE * 5, 0, BASE * 6, 0, P, 3 * H * K * K)


@pytest.mark.parametrize("strides, match", [
    ((4 * 128 * 128, 128 * 128, 1, 128), "contiguous within each row"),
    ((128 * 128, 128 * 128, 128, 1), "rows overlap"),
])
def test_pool_rows_must_be_contiguous_and_apart(strides, match):
    a = good(B=1)
    a.update(initial_state=arr((9, 4, 128, 128), "float32", strides=strides), state_indices=arr((1,), "int32"))
    with pytest.raises(ValueError, match=f"initial_state.*{match}|initial_state's {match}"):
        check(**a)


def test_contiguous_states_offline(offline):
    """Without state_indices: the row count is N, no index or has_initial_state pointer, and the
    final state a new array unless final_state (may be initial_state itself) is given."""
    a = good(B=2)
    s0 = arr((2, 4, 128, 128), "float32", ptr=BASE * 5)
    _, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **SAFE_GATE_FLAGS._asdict(),
                            A_log=a["A_log"], dt_bias=a["dt_bias"], initial_state=s0, output_final_state=True)
    assert _recurrence_states(offline[-1]) == (BASE * 5, BASE * 2, 0, 0, 0, 2, 4 * 128 * 128, 0)
    assert fs.ptr == BASE * 2 and tuple(fs.shape) == (2, 4, 128, 128)
    _, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **SAFE_GATE_FLAGS._asdict(),
                            A_log=a["A_log"], dt_bias=a["dt_bias"], initial_state=s0, final_state=s0,
                            state_v_first=True)
    assert _recurrence_states(offline[-1])[:2] == (BASE * 5, BASE * 5) and fs is s0
    assert offline[-1][5].param_dict["VFIRST"] is True


@pytest.mark.parametrize("given", ["final_state", "output_final_state", "pool", "pool_not_asked", "none"])
def test_empty_batch_returns_as_a_full_one_offline(offline, given):
    """B = 0: nothing is launched, and the returned final state follows the same rule as a
    non-empty call (a given final_state always; the pool only when asked for; a new one when asked for)."""
    a = good(B=0)
    H, K = 4, 128
    kw = dict(A_log=a["A_log"], dt_bias=a["dt_bias"], **SAFE_GATE_FLAGS._asdict(), state_v_first=True)
    buf = arr((0, H, K, K), "float32", ptr=BASE * 5)
    pool = arr((3, H, K, K), "float32", ptr=BASE * 6)
    call = {"final_state": dict(final_state=buf), "output_final_state": dict(output_final_state=True),
            "pool": dict(initial_state=pool, state_indices=arr((0,), "int32"), output_final_state=True),
            "pool_not_asked": dict(initial_state=pool, state_indices=arr((0,), "int32")), "none": {}}[given]
    o, fs = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **kw, **call)
    assert offline == [], "an empty batch launches nothing"
    assert tuple(o.shape) == (0, 100, H, K)
    expected = {"final_state": buf, "output_final_state": "new", "pool": pool, "pool_not_asked": None, "none": None}[given]
    if expected == "new":
        assert tuple(fs.shape) == (0, H, K, K) and fs.dtype == "float32"
    else:
        assert fs is expected


@pytest.mark.parametrize("lower_bound", [float("nan"), float("-inf"), 0.5])
def test_a_bad_lower_bound_is_named_where_the_gate_mode_does_not_read_it(offline, lower_bound):
    """g as the log-decay ignores lower_bound, but a bad one is still refused, never ignored."""
    a = good()
    with pytest.raises(ValueError, match="lower_bound must be finite and <= 0"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"],
                        **PRECOMPUTED_FLAGS._replace(lower_bound=lower_bound)._asdict())
    assert offline == []


@pytest.mark.parametrize("lengths, segmented", [([1300, 547, 2048, 963, 271, 3063], False),
                                                ([60000, 1000, 3000, 1], True)])
def test_cu_seqlens_cpu_tells_the_planner_the_longest_sequence_offline(offline, lengths, segmented):
    """Without cu_seqlens_cpu a varlen call at 64 heads plans segment passes (a sequence could be
    long); with it the planner skips them where no sequence is longer than a share."""
    H, T = 64, sum(lengths)
    a = good(B=1, T=T, H=H)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    a["cu_seqlens"] = arr((len(lengths) + 1,), "int32")
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    assert "kda_segment_scan" in [e[0] for e in offline]
    offline.clear()
    for host in (cu, cu.tolist(), cu.astype(np.int32)):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), cu_seqlens_cpu=host)
        assert ("kda_segment_scan" in [e[0] for e in offline]) is segmented
        offline.clear()


def torch_or_list(values):
    """A CPU tensor of `values` where torch is installed (fla's callers pass one), else the list."""
    try:
        import torch
    except ImportError:
        return values
    return torch.tensor(values)


def test_bad_cu_seqlens_cpu_is_named(offline):
    a = good(B=1, T=5000, H=2)
    a["cu_seqlens"] = arr((3,), "int32")
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be 1-D integers"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), cu_seqlens_cpu=object())
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be 1-D integers"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a),
                        cu_seqlens_cpu=[[0], [2500], [5000]])
    for other in ([0, 5000], np.array([0, 1000, 2000, 5000]), torch_or_list([0, 5000])):   # not N + 1 = 3 entries
        with pytest.raises(ValueError, match=r"cu_seqlens_cpu must be the host copy of cu_seqlens \(3 entries\)"):
            pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), cu_seqlens_cpu=other)
    a["cu_seqlens"] = None
    with pytest.raises(ValueError, match="cu_seqlens_cpu is given without cu_seqlens"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), cu_seqlens_cpu=[0, 5000])
    short = good(B=1, T=100, H=2)   # too short to read the hint: refused all the same
    with pytest.raises(ValueError, match="cu_seqlens_cpu is given without cu_seqlens"):
        pykda.chunk_kda(short["q"], short["k"], short["v"], short["g"], short["beta"], **call_kwargs(short),
                        cu_seqlens_cpu=[0, 100])
    assert offline == []


def test_recurrence_grid_is_slot_major_within_grid_z():
    from pykda.ops import kda
    assert kda._slot_major(2, 8, 65535) == (2, 8, 65535)
    assert kda._slot_major(2, 8, 65536) == (2 * 65536, 8, 1)   # the kernel reads the slot from x then


def test_prepare_grid_orders_heads_fastest_for_few_heads_within_grid_y():
    from pykda.ops import kda
    assert kda.prepare_grid(96, 512, False) == (512, 96, 1) and kda.prepare_grid(96, 70000, False) == (70000, 96, 1)
    assert kda.prepare_grid(8, 512, True) == (8, 512, 1)
    assert kda.prepare_grid(1, 65535, True) == (1, 65535, 1)
    for slots in (65536, 65538, 3 * 65535 + 1, (1 << 31) - 1):   # the kernel's slot: y + z·gridDim.y
        h, y, z = kda.prepare_grid(4, slots, True)
        assert h == 4 and y <= 65535 and z <= 65535 and slots <= y * z < slots + z, slots
    softplus = KdaVariant("softplus", "logit", True, "bfloat16", "bfloat16", 0.0)
    problems = [KdaProblem(1, 8192, H, 128, 1, False, 16, "float32", softplus, True, 1) for H in (1, 16, 17, 96)]
    assert [kda.heads_fastest(p) for p in problems] == [True, True, False, False]


# fla 0.6.0's positional parameters (fla.ops.kda.chunk_kda, fused_recurrent_kda): a call by position
# must mean the same to both libraries
FLA_CHUNK_KDA = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
                 "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "safe_gate", "lower_bound",
                 "disable_recompute", "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
                 "cp_context", "use_graph", "max_num_seqs")
FLA_FUSED_RECURRENT_KDA = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "scale", "initial_state",
                           "output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
                           "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "lower_bound", "state_v_first",
                           "cu_seqlens")


def positional(fn) -> tuple:
    import inspect
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds)


def test_positional_parameters_are_fla_s():
    assert positional(pykda.chunk_kda) == FLA_CHUNK_KDA
    assert positional(pykda.fused_recurrent_kda) == FLA_FUSED_RECURRENT_KDA


def test_positional_parameters_match_the_installed_fla():
    fla_kda = pytest.importorskip("fla.ops.kda")   # (fla needs triton: the GPU machine's peers)
    assert positional(fla_kda.chunk_kda) == positional(pykda.chunk_kda)
    assert positional(fla_kda.fused_recurrent_kda) == positional(pykda.fused_recurrent_kda)


def test_a_call_by_position_reads_as_fla_s(offline):
    """Every positional argument up to cu_seqlens_cpu, as fla's callers may pass them, launches what
    the same call by keyword launches."""
    a = good(B=1, T=300, H=2, K=64)
    a["cu_seqlens"] = arr((3,), "int32")
    s0 = arr((2, 2, 64, 64), "float32")
    kw = dict(scale=0.3, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
              use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, safe_gate=True,
              lower_bound=-3.0, disable_recompute=False, return_intermediate_states=True, state_v_first=True,
              cu_seqlens=a["cu_seqlens"], cu_seqlens_cpu=[0, 100, 300])
    run = lambda *args, **kwargs: pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], *args,   # noqa: E731
                                                  A_log=a["A_log"], dt_bias=a["dt_bias"], **kwargs)
    by_keyword = run(**kw)
    keyed = [entry[:5] for entry in offline]
    offline.clear()
    by_position = run(*kw.values())
    assert [entry[:5] for entry in offline] == keyed and len(by_position) == len(by_keyword) == 3
    assert keyed[-1][4][-4:-1] == (BASE * 2, 4, 6)   # checkpoints every 64 tokens: 2 + 4 of them


@pytest.mark.parametrize("chunk_size, kernel_chunk, every", [(16, 16, 64), (32, 32, 32), (64, 16, 64)])
def test_fla_s_chunk_sizes_space_the_checkpoints_as_fla_does(offline, chunk_size, kernel_chunk, every):
    """fla's chunk_size (32 or 64, its default) is the spacing of its intermediate states: pykda
    runs its kernels' chunk (64: chunks of 16) and checkpoints every chunk_size tokens by default."""
    a = good(B=2, T=200, H=2, K=64)
    a["chunk_size"] = chunk_size
    o, fs, ckpt = pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a),
                                  return_intermediate_states=True)
    assert tuple(ckpt.shape) == (2, -(-200 // every), 2, 64, 64)
    prep, rec = offline[-2], offline[-1]
    assert prep[5].param_dict["C"] == rec[5].param_dict["C"] == kernel_chunk
    assert rec[4][-3] == every // kernel_chunk


@pytest.mark.parametrize("good_kwargs, bad_kwargs, message", [
    (dict(chunk_size=16), dict(chunk_size=16.0), "chunk_size must be one of .*got 16.0"),
    (dict(chunk_size=32), dict(chunk_size=32.0), "chunk_size must be one of .*got 32.0"),
    (dict(checkpoint_every=64), dict(checkpoint_every=64.0), "checkpoint_every must be an int"),
    (dict(warps=2), dict(warps=2.0), "warps must be 1, 2, 4 or 8 .*got 2.0"),
    (dict(stages=3), dict(stages=3.0), r"stages must be in 2..8; got 3.0 \(an int is needed\)"),
    (dict(segment_chunks=0), dict(segment_chunks=False), "segment_chunks must be a non-negative int .*got False"),
])
def test_a_bad_setting_equal_to_a_prepared_good_one_still_raises(offline, good_kwargs, bad_kwargs, message):
    """Settings are resolved when a call is prepared: a later call whose bad value compares equal
    to the good one (16.0 == 16) must not find that prepared call."""
    a = good(B=2, T=100, H=2, K=64)
    x = (a["q"], a["k"], a["v"], a["g"], a["beta"])
    pykda.chunk_kda(*x, **dict(call_kwargs(a), **good_kwargs), return_intermediate_states=True)
    launched = len(offline)
    with pytest.raises(ValueError, match=message):
        pykda.chunk_kda(*x, **dict(call_kwargs(a), **bad_kwargs), return_intermediate_states=True)
    assert len(offline) == launched


@pytest.mark.parametrize("bad", [16.0, True, "16"])
def test_chunk_size_must_be_an_int(offline, bad):
    """(a float equal to 16 would reach the templates as 16.0)"""
    a = good(B=2, T=200, H=2, K=64)
    a["chunk_size"] = bad
    with pytest.raises(ValueError, match=f"chunk_size must be one of .*got {bad!r}"):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    assert offline == []


def test_chunk_size_64_runs_the_default_kernels(offline):
    a = good(B=2, T=200, H=2, K=64)
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    default = [entry[:5] for entry in offline]
    offline.clear()
    a["chunk_size"] = 64
    pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a))
    assert [entry[:5] for entry in offline] == default


@pytest.mark.parametrize("op", ["chunk_kda", "fused_recurrent_kda"])
def test_transpose_state_layout_is_fla_s_old_name_for_state_v_first(op):
    from pykda.ops.kda_variant import resolve_state_v_first
    assert resolve_state_v_first(True, None) is True and resolve_state_v_first(False, None) is False
    with pytest.warns(DeprecationWarning, match="transpose_state_layout is deprecated"):
        assert resolve_state_v_first(False, True) is True
    with pytest.raises(ValueError, match="Cannot pass both state_v_first and the deprecated transpose_state_layout"):
        resolve_state_v_first(True, True)
    assert "transpose_state_layout" in __import__("inspect").signature(getattr(pykda, op)).parameters


def test_transpose_state_layout_reaches_the_kernels(offline):
    """A K-first call under the old name compiles the V-first recurrence, as state_v_first=True does."""
    a = good(B=2, T=100, H=2, K=64)
    a["state_v_first"] = False
    with pytest.warns(DeprecationWarning):
        pykda.chunk_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], **call_kwargs(a), transpose_state_layout=True)
    assert offline[-1][5].param_dict["VFIRST"] is True


@pytest.mark.parametrize("op", ["chunk_kda", "fused_recurrent_kda", "single_decode_with_kv_cache"])
@pytest.mark.parametrize("stages", [3.0, "3"])
def test_a_stages_override_that_is_not_an_int_is_named(op, stages):
    """stages=3.0 passed `stages in range(2, 9)` and reached the kernel's template and the launch
    geometry as a float (a float shared-memory size, a TypeError or an NVRTC error at launch):
    refused by name before anything is compiled. NumPy ints are ints."""
    from pykda.ops.checks import check_stages
    a = good(B=2, T=100, H=2, K=64)
    x = [a[n] for n in ("q", "k", "v", "g", "beta")]
    call = {"chunk_kda": lambda **kw: pykda.chunk_kda(*x, **call_kwargs(a), **kw),
            "fused_recurrent_kda": lambda **kw: pykda.fused_recurrent_kda(
                *x, A_log=a["A_log"], dt_bias=a["dt_bias"], **SAFE_GATE_FLAGS._asdict(), state_v_first=True,
                initial_state=arr((4, 2, 64, 64), "float32"), **kw),
            "single_decode_with_kv_cache": lambda **kw: pykda.single_decode_with_kv_cache(
                arr((8, 128)), arr((1000, 2, 128)), arr((1000, 2, 128)), **kw)}[op]
    with pytest.raises(ValueError, match=r"stages must be in 2..8; got .* \(an int is needed\)"):
        call(stages=stages)
    check_stages(np.int64(3))
    check_stages(None)


@pytest.mark.parametrize("warps", [4.0, "4"])
def test_a_warps_override_that_is_not_an_int_is_named(offline, warps):
    """warps=4.0 passed `warps in (1, 2, 4, 8)` and made a float grid and block (a TypeError at
    launch): refused by name."""
    a = good(B=2, T=100, H=2, K=64)
    with pytest.raises(ValueError, match="warps must be 1, 2, 4 or 8"):
        pykda.chunk_kda(*(a[n] for n in ("q", "k", "v", "g", "beta")), **call_kwargs(a), warps=warps)
    assert offline == []
    p = problem(1, 100, 2, 64, 1, False)
    assert plan_kda(p, H200_SMS, warps=np.int32(2)).warps == 2
