"""CPU tests of KDA decode argument checks and planning (no GPU needed)."""
import numpy as np
import pytest

import pykda
from pykda import runtime
from pykda.ops import kda_decode
from pykda.ops.kda_decode import (KdaDecodeProblem, check_state_indices, min_ctas, plan_kda_decode, stage_bytes,
                                  sums_bytes, tile_rows, validate_kda_decode)
from pykda.ops.kda_variant import SAFE_GATE_FLAGS, KdaFlags, KdaVariant
from fakes import BASE, FakeKernel, device_array as arr

SOFTPLUS_FLAGS = KdaFlags(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
VLLM_FLAGS = KdaFlags(use_qk_l2norm_in_kernel=True)   # vLLM's decode: g precomputed (fp32), beta probabilities
SAFE = KdaVariant("safe", "logit", True, "bfloat16", "bfloat16", -5.0)


def args(B=4, T=1, H=8, K=128, P=16, state_dtype="float32", **over):
    a = dict(q=arr((B, T, H, K)), k=arr((B, T, H, K)), v=arr((B, T, H, K)), g=arr((B, T, H, K)),
             beta=arr((B, T, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
             state=arr((P, H, K, K), state_dtype), state_indices=arr((B,), "int32"), cu_seqlens=None, out=None,
             flags=SAFE_GATE_FLAGS, state_v_first=True)
    a.update(over)
    return a


def problem(B, H, dim, pool, state_dtype, variant=SAFE):
    return KdaDecodeProblem(B, 1, H, dim, B, pool, state_dtype, "int32", "int32", variant)


def test_valid_problem_is_described():
    p = validate_kda_decode(**args())
    assert (p.batch, p.tokens, p.heads, p.dim, p.sequences, p.pool_rows) == (4, 1, 8, 128, 4, 16)
    assert p.variant == SAFE
    p = validate_kda_decode(**args(B=1, T=9, cu_seqlens=arr((4,), "int64"), state_indices=arr((3,), "int64"),
                                   dt_bias=arr((8 * 128,), "float32"), state_dtype="bfloat16"))
    assert (p.sequences, p.cu_dtype, p.index_dtype, p.state_dtype) == (3, "int64", "int64", "bfloat16")
    assert (p.index_cols, p.accepted_dtype) == (0, "int32")


def test_speculative_decode_problem_is_described():
    """2-D state_indices [N, C] (a row per token) with num_accepted_tokens; with cu_seqlens C
    need not reach the packed T."""
    p = validate_kda_decode(**args(T=4, q=arr((4, 4, 8, 128)), k=arr((4, 4, 8, 128)), v=arr((4, 4, 8, 128)),
                                   g=arr((4, 4, 8, 128)), beta=arr((4, 4, 8)), state_indices=arr((4, 5), "int64"),
                                   num_accepted_tokens=arr((4,), "int64")))
    assert (p.tokens, p.index_cols, p.index_dtype, p.accepted_dtype) == (4, 5, "int64", "int64")
    p = validate_kda_decode(**args(B=1, T=12, cu_seqlens=arr((4,), "int32"), state_indices=arr((3, 4), "int32"),
                                   num_accepted_tokens=arr((3,), "int32")))
    assert (p.sequences, p.index_cols) == (3, 4)
    # a view of a wider buffer (vLLM slices its [max_seqs, C] table): rows may be strided
    p = validate_kda_decode(**args(state_indices=arr((4, 2), "int32", strides=(8, 1))))
    assert p.index_cols == 2


def test_k_first_pools_are_accepted():
    """fla's layout [P, H, K, V] (state_v_first=False): the same checks, the layout in the problem."""
    p = validate_kda_decode(**args(state_v_first=False))
    assert p.v_first is False and (p.dim, p.pool_rows) == (128, 16)
    assert validate_kda_decode(**args()).v_first is True
    p = validate_kda_decode(**args(state_v_first=False, T=4, q=arr((4, 4, 8, 128)), k=arr((4, 4, 8, 128)),
                                   v=arr((4, 4, 8, 128)), g=arr((4, 4, 8, 128)), beta=arr((4, 4, 8)),
                                   state_indices=arr((4, 4), "int32"), num_accepted_tokens=arr((4,), "int32"),
                                   state_dtype="bfloat16"))
    assert (p.v_first, p.index_cols, p.state_dtype) == (False, 4, "bfloat16")


def test_gate_modes_are_accepted():
    """Kimi Linear's softplus gate with A_log [1, 1, H, 1]; vLLM's form: fp32 g (the log-decay)
    and fp32 beta (probabilities), no A_log or dt_bias."""
    p = validate_kda_decode(**args(flags=SOFTPLUS_FLAGS, A_log=arr((1, 1, 8, 1), "float32")))
    assert p.variant == KdaVariant("softplus", "logit", True, "bfloat16", "bfloat16", 0.0)
    p = validate_kda_decode(**args(flags=VLLM_FLAGS, A_log=None, dt_bias=None, g=arr((4, 1, 8, 128), "float32"),
                                   beta=arr((4, 1, 8), "float32")))
    assert p.variant == KdaVariant("none", "prob", True, "float32", "float32", 0.0)
    p = validate_kda_decode(**args(flags=VLLM_FLAGS, A_log=None, dt_bias=None, beta=arr((4, 1, 8), "float32")))
    assert (p.variant.g_dtype, p.variant.beta_dtype) == ("bfloat16", "float32")


@pytest.mark.parametrize("over, exc, message", [
    (dict(state=arr((16, 8, 128, 128), "float16")), TypeError, "initial_state must have dtype float32 or bfloat16"),
    (dict(state=arr((16, 8, 64, 128))), ValueError, r"initial_state must have shape \[P, H, V, K\]"),
    (dict(state=None), ValueError, "initial_state .* is required"),
    (dict(state_indices=arr((4,), "float32")), TypeError, "state_indices must have dtype int32 or int64"),
    (dict(state_indices=arr((5,), "int32")), ValueError, "state_indices must have shape"),
    (dict(state_indices=arr((4, 1, 1), "int32")), ValueError, r"state_indices must have shape .*; got \(4, 1, 1\)"),
    (dict(state_indices=arr((5, 2), "int32")), ValueError, r"state_indices must have shape \[N, T\] .* = \(4, 2\)"),
    (dict(state_indices=arr((4, 0), "int32")), ValueError, r"state_indices \[N, C\] needs a column per token"),
    (dict(q=arr((4, 3, 8, 128)), k=arr((4, 3, 8, 128)), v=arr((4, 3, 8, 128)), g=arr((4, 3, 8, 128)),
          beta=arr((4, 3, 8)), state_indices=arr((4, 2), "int32")), ValueError, r"C >= T = 3.*; got C = 2"),
    (dict(state_indices=arr((4, 2), "int32", strides=(2, 2))), ValueError, "state_indices must be contiguous in its last"),
    (dict(state_indices=arr((4, 2), "int16")), TypeError, "state_indices must have dtype int32 or int64"),
    (dict(num_accepted_tokens=arr((4,), "int32")), ValueError, r"num_accepted_tokens needs 2-D state_indices"),
    (dict(state_indices=arr((4, 2), "int32"), num_accepted_tokens=arr((4,), "float32")), TypeError,
     "num_accepted_tokens must have dtype int32 or int64"),
    (dict(state_indices=arr((4, 2), "int32"), num_accepted_tokens=arr((3,), "int32")), ValueError,
     r"num_accepted_tokens must have shape \[N\] = \(4,\)"),
    (dict(state_indices=arr((4, 2), "int32"), num_accepted_tokens=arr((4,), "int32", strides=(2,))), ValueError,
     "num_accepted_tokens must be contiguous"),
    (dict(state_indices=arr((4, 2), "int32"), num_accepted_tokens=arr((4,), "int32", device=1)), ValueError,
     "all arrays must be on one device"),
    (dict(q=arr((4, 0, 8, 128)), k=arr((4, 0, 8, 128)), v=arr((4, 0, 8, 128)), g=arr((4, 0, 8, 128)),
          beta=arr((4, 0, 8))), ValueError, "at least one token"),
    (dict(q=arr((2, 2 ** 30, 8, 128)), k=arr((2, 2 ** 30, 8, 128)), v=arr((2, 2 ** 30, 8, 128)),
          g=arr((2, 2 ** 30, 8, 128)), beta=arr((2, 2 ** 30, 8)), state_indices=arr((2,), "int32")),
     ValueError, r"B \* T = 2147483648 tokens; the kernel indexes tokens with 32-bit ints"),
    (dict(q=arr((4, 1, 8, 96))), ValueError, r"head dim K must be one of \(64, 128\); got 96"),
    (dict(q=arr((4, 1, 8, 128), "float16")), TypeError, "q must have dtype bfloat16"),
    (dict(k=arr((4, 1, 8, 64))), ValueError, "k must have shape"),
    (dict(v=arr((4, 1, 16, 128))), ValueError, r"v has 16 heads and q 8: grouped value heads \(HV > H\) are not supported"),
    (dict(beta=arr((4, 1, 8, 1))), ValueError, "beta must be 3-D"),
    (dict(g=arr((4, 1, 8, 128), "float16")), TypeError, "g must have dtype bfloat16 or float32; got float16"),
    (dict(beta=arr((4, 1, 8), "float16")), TypeError, "beta must have dtype bfloat16 or float32; got float16"),
    (dict(A_log=arr((8,), "bfloat16")), TypeError, "A_log must have dtype float32"),
    (dict(A_log=arr((1, 1, 9, 1), "float32")), ValueError, r"A_log must hold H = 8 elements"),
    (dict(dt_bias=arr((8, 64), "float32")), ValueError, r"dt_bias must hold H\*K = 1024 elements"),
    (dict(dt_bias=arr((8, 128), "bfloat16")), TypeError, "dt_bias must have dtype float32"),
    (dict(flags=VLLM_FLAGS, dt_bias=None), ValueError, "A_log is given but use_gate_in_kernel=False"),
    (dict(flags=VLLM_FLAGS, A_log=None), ValueError, "dt_bias is given but use_gate_in_kernel=False"),
    (dict(flags=SOFTPLUS_FLAGS, A_log=None), ValueError, "use_gate_in_kernel=True without lower_bound .* needs A_log"),
    (dict(flags=SAFE_GATE_FLAGS._replace(lower_bound=None)), ValueError,
     "safe_gate=True with use_gate_in_kernel=True needs lower_bound"),
    (dict(flags=SAFE_GATE_FLAGS._replace(lower_bound=1.0)), ValueError, "lower_bound must be finite and <= 0"),
    (dict(flags=SAFE_GATE_FLAGS._replace(use_beta_sigmoid_in_kernel=False, allow_neg_eigval=True)), ValueError,
     "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    (dict(state_v_first=False, state=arr((16, 8, 64, 128))), ValueError, r"initial_state must have shape \[P, H, K, V\]"),
    (dict(state_v_first=False, state=arr((16, 8, 128), "float32")), ValueError, r"initial_state must be 4-D \[P, H, K, V\]"),
    (dict(cu_seqlens=arr((3,), "int32")), ValueError, "batch size must be 1"),
    (dict(state_indices=None, state=arr((2, 8, 128, 128))), ValueError, "needs at least 4 rows"),
    (dict(q=arr((4, 1, 8, 128), ptr=BASE + 2)), ValueError, "q must start at a 16-byte aligned address"),
    (dict(v=arr((4, 1, 8, 128), ptr=BASE + 8)), ValueError, "v must start at a 16-byte aligned address"),
    (dict(v=arr((4, 1, 8, 128), strides=(1036, 1036, 128, 1))), ValueError, "v: stride 1036 of dim 0"),
    (dict(out=arr((4, 1, 8, 64))), ValueError, "out must have shape"),
    (dict(v=arr((4, 1, 8, 128), device=1)), ValueError, "all arrays must be on one device"),
])
def test_bad_input_names_the_argument(over, exc, message):
    with pytest.raises(exc, match=message):
        validate_kda_decode(**args(**over))


@pytest.fixture
def no_launch(monkeypatch):
    """A call that gets past validation fails the test: nothing may reach the GPU."""
    def launched(*a, **k):
        raise AssertionError("validation let the call through to the kernel")
    monkeypatch.setattr(kda_decode.runtime, "require_gpu", launched)
    monkeypatch.setattr(kda_decode, "plan_for", launched)
    monkeypatch.setattr(kda_decode, "PREPARED", kda_decode.Memo(kda_decode.PREPARED.make))


def _call(a, **kw):
    return pykda.fused_recurrent_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"],
                                     dt_bias=a["dt_bias"], initial_state=a["state"], state_indices=a["state_indices"],
                                     **kw)


@pytest.mark.parametrize("kw, exc, message", [
    (dict(**SAFE_GATE_FLAGS._asdict(), state_v_first=True, ssm_state_indices=arr((4,), "int32")), ValueError,
     "pass state_indices or ssm_state_indices"),
    (dict(**SAFE_GATE_FLAGS._asdict(), state_v_first=True, inplace_final_state=False), ValueError,
     "inplace_final_state=False is not supported"),
    (dict(**SAFE_GATE_FLAGS._asdict(), state_v_first=True, num_accepted_tokens=arr((4,), "int32")), ValueError,
     "num_accepted_tokens needs 2-D state_indices"),
    (dict(state_v_first=True), ValueError, "A_log is given but use_gate_in_kernel=False"),   # fla's defaults
    (dict(**SOFTPLUS_FLAGS._replace(safe_gate=True)._asdict(), state_v_first=True), ValueError, "safe_gate=True .* needs lower_bound"),
])
def test_fused_recurrent_kda_refuses_before_any_launch(no_launch, kw, exc, message):
    with pytest.raises(exc, match=message):
        _call(args(), **kw)


@pytest.fixture
def fake_launch(monkeypatch):
    """fused_recurrent_kda past validation with the kernel stubbed (a FakeKernel whose spec is the
    problem): each launch's problem, arguments (the call's pointers in place) and stream are
    recorded."""
    launches, log = [], []
    plan = kda_decode.KdaDecodePlan(rpt=8, stages=3, n_tiles=16, grid=16, smem=1024)
    monkeypatch.setattr(kda_decode.runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(kda_decode, "plan_for", lambda p, dev, rpt, stages: (plan, p))
    monkeypatch.setattr(kda_decode.runtime, "get_kernel", lambda p, dev, name: FakeKernel(name, p, log))
    monkeypatch.setattr(kda_decode, "PREPARED", kda_decode.Memo(kda_decode.PREPARED.make))
    launch = runtime.CallValues.launch

    def launch_recorded(values, ptrs, bound, stream):
        launch(values, ptrs, bound, stream)
        launches.extend((p, launch_args, stream) for *_, launch_args, p in log)
        log.clear()
    monkeypatch.setattr(runtime.CallValues, "launch", launch_recorded)
    return launches


@pytest.mark.parametrize("output_final_state", [False, True])
@pytest.mark.parametrize("mode", ["safe", "softplus", "vllm"])
def test_decode_returns_the_output_and_the_pool(fake_launch, mode, output_final_state):
    """(o, pool if output_final_state else None); the gate's arrays and lower_bound are passed
    only where the gate reads them."""
    flags = {"safe": SAFE_GATE_FLAGS, "softplus": SOFTPLUS_FLAGS, "vllm": VLLM_FLAGS}[mode]
    gate = mode != "vllm"
    a = args(A_log=arr((1, 1, 8, 1), "float32", ptr=BASE * 3) if gate else None,
             dt_bias=arr((8 * 128,), "float32", ptr=BASE * 4) if gate else None,
             g=arr((4, 1, 8, 128), "bfloat16" if gate else "float32"),
             beta=arr((4, 1, 8), "bfloat16" if gate else "float32"), state=arr((16, 8, 128, 128), ptr=BASE * 5))
    out = arr((4, 1, 8, 128), ptr=BASE * 2)
    o, pool = _call(a, **flags._asdict(), state_v_first=True, out=out, stream=7, output_final_state=output_final_state)
    assert o is out
    assert (pool is a["state"]) if output_final_state else (pool is None)
    ((p, launch_args, stream),) = fake_launch
    assert stream == 7 and p.variant.gate == {"vllm": "none"}.get(mode, mode)
    assert launch_args[6:9] == ((BASE * 3, BASE * 4) if gate else (0, 0)) + (BASE * 5,)
    assert launch_args[21] == (-5.0 if mode == "safe" else 0.0)


def test_fla_default_layout_reaches_the_kernel_k_first(fake_launch):
    """fla's default (no state_v_first): a K-first pool, updated in place like a V-first one."""
    a = args(state=arr((16, 8, 128, 128), ptr=BASE * 5))
    _call(a, **SAFE_GATE_FLAGS._asdict(), out=arr((4, 1, 8, 128), ptr=BASE * 2), stream=7)
    _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, out=arr((4, 1, 8, 128), ptr=BASE * 2), stream=7)
    (p, launch_args, _), (p2, launch_args2, _) = fake_launch
    assert p.v_first is False and p2.v_first is True and p._replace(v_first=True) == p2
    assert launch_args[8:12] == launch_args2[8:12] == (BASE * 5, 16, 0, 8 * 128 * 128)   # the pool itself, no copy


def test_pool_view_rows_reach_the_kernel(fake_launch):
    """A pool that is a view of a larger cache (rows 2 states apart): its own pointer and row stride."""
    a = args(state=arr((16, 8, 128, 128), ptr=BASE * 5, strides=(2 * 8 * 128 * 128, 128 * 128, 128, 1)))
    _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, out=arr((4, 1, 8, 128), ptr=BASE * 2), stream=7)
    ((_, launch_args, _),) = fake_launch
    assert launch_args[8:12] == (BASE * 5, 16, 0, 2 * 8 * 128 * 128)


def test_first_row_reaches_the_kernel_and_is_checked(fake_launch):
    """first_row (vLLM's null block 0: first_row=1) is a constant of the prepared call, after P;
    another first_row is another call; a bad one raises before any launch."""
    a = args(state=arr((16, 8, 128, 128), ptr=BASE * 5))
    for first in (1, 0, 1, np.int32(1)):   # (a NumPy int as the same Python int)
        _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, out=arr((4, 1, 8, 128), ptr=BASE * 2), stream=7,
              first_row=first)
    assert [launch_args[8:11] for _, launch_args, _ in fake_launch] == [(BASE * 5, 16, f) for f in (1, 0, 1, 1)]
    for bad in (-1, 1.0, True, None):
        with pytest.raises(ValueError, match=r"first_row must be a non-negative int; got"):
            _call(a, **SAFE_GATE_FLAGS._asdict(), stream=7, first_row=bad)
    assert len(fake_launch) == 4
    check_state_indices(np.array([0, 0, 3, -1]), 8, first_row=1)   # rows below 1: padding, never repeated
    with pytest.raises(ValueError, match=r"state_indices repeats pool rows \[0\]"):
        check_state_indices(np.array([0, 0, 3, -1]), 8)


@pytest.mark.parametrize("strides, match", [
    ((8 * 128 * 128, 128 * 128, 1, 128), "contiguous within each row"),
    ((128 * 128, 128 * 128, 128, 1), "rows overlap"),
])
def test_pool_rows_must_be_contiguous_and_apart(strides, match):
    with pytest.raises(ValueError, match=f"initial_state.*{match}|initial_state's {match}"):
        validate_kda_decode(**args(state=arr((16, 8, 128, 128), "float32", strides=strides)))


def test_speculative_call_passes_the_index_table(fake_launch):
    """fla's keywords (ssm_state_indices, num_accepted_tokens): the table's pointer, row stride and
    columns and num_accepted_tokens' pointer reach the kernel; state_indices= is the same call."""
    a = args(T=2, q=arr((4, 2, 8, 128)), k=arr((4, 2, 8, 128)), v=arr((4, 2, 8, 128)), g=arr((4, 2, 8, 128)),
             beta=arr((4, 2, 8)), state=arr((16, 8, 128, 128), ptr=BASE * 5), state_indices=None)
    table, accepted = arr((4, 3), "int32", strides=(8, 1), ptr=BASE * 6), arr((4,), "int32", ptr=BASE * 7)
    for name in ("ssm_state_indices", "state_indices"):
        pykda.fused_recurrent_kda(a["q"], a["k"], a["v"], a["g"], a["beta"], A_log=a["A_log"], dt_bias=a["dt_bias"],
                                  initial_state=a["state"], **SAFE_GATE_FLAGS._asdict(), state_v_first=True,
                                  out=arr((4, 2, 8, 128), ptr=BASE * 2), num_accepted_tokens=accepted, stream=7,
                                  **{name: table})
    (p, first, _), (p2, second, _) = fake_launch
    assert p == p2 and first == second
    assert (p.index_cols, p.tokens) == (3, 2)
    # pool, P, the first row, its row stride, table, the table's row stride, C, accepted
    assert first[8:16] == (BASE * 5, 16, 0, 8 * 128 * 128, BASE * 6, 8, 3, BASE * 7)


def test_index_values_checked_on_request():
    check_state_indices(np.array([3, -1, 0, 7]), 8)
    with pytest.raises(ValueError, match="state_indices holds 8, out of range for a pool of 8 rows"):
        check_state_indices(np.array([3, 8]), 8)
    with pytest.raises(ValueError, match=r"state_indices repeats pool rows \[3\]"):
        check_state_indices(np.array([3, -1, 3, -1]), 8)
    check_state_indices(np.array([[3, -1, 0], [1, 2, -1]]), 8)   # 2-D: every entry is a row of its own
    with pytest.raises(ValueError, match=r"state_indices repeats pool rows \[2\]"):
        check_state_indices(np.array([[3, 2, 0], [1, 2, -1]]), 8)


@pytest.mark.parametrize("state, dim", [("float32", 128), ("float32", 64), ("bfloat16", 128), ("bfloat16", 64)])
def test_plan_fills_the_gpu_and_tiles_v(state, dim):
    for batch in (1, 8, 64, 256):
        p = problem(batch, 32, dim, batch, state)
        plan = plan_kda_decode(p, 132, 233472)
        rows = tile_rows(p, plan.rpt)
        assert dim % rows == 0 and plan.n_tiles == batch * 32 * dim // rows
        per_sm = min_ctas(state, plan.rpt)
        assert plan.grid == min(plan.n_tiles, 132 * per_sm)
        assert per_sm * (plan.smem + 1024) <= 233472 and plan.stages == 3, "three stages for each CTA of an SM"
        assert plan.n_tiles >= 132 // 4 or plan.rpt == 1, "tiles for a quarter of the SMs"
        bigger = 2 * plan.rpt
        assert bigger > 8 or tile_rows(p, bigger) > dim or batch * 32 * dim // tile_rows(p, bigger) < 132 // 4, \
            "the largest such tiles"
    p = problem(1, 2, 128, 1, "float32")
    assert plan_kda_decode(p, 132, 233472).n_tiles >= 132 // 4, "few heads: smaller tiles reach more SMs"


@pytest.mark.parametrize("state, dim, rpt, per_sm", [("float32", 128, 32, 1), ("bfloat16", 128, 16, 1),
                                                    ("float32", 64, 8, 3), ("bfloat16", 64, 4, 3)])
@pytest.mark.parametrize("tokens", [1, 4, 8])
def test_k_first_tiles_are_whole_states(state, dim, rpt, per_sm, tokens):
    """A K-first tile is one (sequence, head) state, K rows (its column sums need them all): one
    tile per state, at least two stages (three where they fit) plus the column-sum buffer within
    the H200's 227 KB per block, the CTAs per SM its registers allow."""
    for batch in (1, 64, 256):
        p = KdaDecodeProblem(batch, tokens, 32, dim, batch, batch, state, "int32", "int32", SAFE, v_first=False)
        plan = plan_kda_decode(p, 132, 233472)
        assert plan.rpt == rpt and tile_rows(p, rpt) == dim and plan.n_tiles == batch * 32
        assert min_ctas(state, rpt) == per_sm and plan.grid == min(plan.n_tiles, 132 * per_sm)
        assert plan.smem == plan.stages * stage_bytes(p, rpt) + sums_bytes(p) + 1024 <= 232448
        assert per_sm * (plan.smem + 1024) <= 233472
        third_fits = per_sm * (plan.smem + stage_bytes(p, rpt) + 1024 + 3072) <= 233472
        assert plan.stages == 3 or (plan.stages == 2 and not third_fits)
    assert sums_bytes(p) == 2 * 4 * 2 * dim * 4 and sums_bytes(p._replace(v_first=True)) == 0
    assert plan_kda_decode(p, 132, 233472, rpt=rpt) == plan
    with pytest.raises(ValueError, match=rf"whole-state tiles: rows_per_thread must be None or {rpt}"):
        plan_kda_decode(p, 132, 233472, rpt=rpt // 2)
    with pytest.raises(ValueError, match=rf"rows_per_thread must be None or {rpt}"):
        plan_kda_decode(p, 132, 233472, rpt=float(rpt))   # (a float would reach the template and the grid)


@pytest.mark.parametrize("rpt", [4.0, "4", True])
def test_rows_per_thread_must_be_an_int(rpt):
    p = problem(64, 32, 128, 1, "float32")
    plan_kda_decode(p, 132, 233472, rpt=4)   # (the plan of the int a bad value equals is cached first)
    with pytest.raises(ValueError, match=f"rows_per_thread must be 1, 2, 4 or 8 .*got {rpt!r}"):
        plan_kda_decode(p, 132, 233472, rpt=rpt)
    assert plan_kda_decode(p, 132, 233472, rpt=np.int32(4)).rpt == 4


def test_k_first_spec_differs_only_by_layout():
    p = problem(1, 32, 128, 1, "float32")
    k_first = p._replace(v_first=False)
    v_spec = kda_decode.kda_decode_spec(p, 8, 3, "sm_90a").param_dict
    k_spec = kda_decode.kda_decode_spec(k_first, 32, 3, "sm_90a").param_dict
    assert v_spec.pop("VFIRST") is True and k_spec.pop("VFIRST") is False
    assert {n for n in v_spec if v_spec[n] != k_spec[n]} == {"RPT", "MIN_CTAS", "STAGE_BYTES"}


def test_fp32_g_rides_the_ring_in_fp32():
    """A stage holds each staged token's g row: 4 bytes an element when g is fp32 (vLLM's form)."""
    bf = problem(1, 32, 128, 1, "float32")
    f32 = problem(1, 32, 128, 1, "float32", KdaVariant("none", "prob", True, "float32", "float32", 0.0))
    assert stage_bytes(f32, 8) - stage_bytes(bf, 8) == 128 * 2   # one staged token, 128 elements
    assert plan_kda_decode(f32, 132, 233472).stages == 3


def test_plan_overrides_are_checked():
    p = problem(1, 32, 64, 1, "bfloat16")
    assert plan_kda_decode(p, 132, 233472, rpt=2, stages=3).stages == 3
    with pytest.raises(ValueError, match="rows_per_thread"):
        plan_kda_decode(p, 132, 233472, rpt=8)   # 128 rows > 64
    with pytest.raises(ValueError, match="rows_per_thread"):
        plan_kda_decode(p, 132, 233472, rpt=3)


# ---- target verify (SGLang's intermediate_states_buffer) ----
@pytest.mark.parametrize("disable", [False, True])
def test_target_verify_reaches_the_kernel(fake_launch, disable):
    """intermediate_states_buffer [S, steps, H, V, K] and intermediate_state_indices [N]: the
    VERIFY kernel gets the buffer, the slots, the buffer's step stride, steps, S and whether the
    pool is written back (disable_state_update=True: not)."""
    a = args(B=1, T=12, cu_seqlens=arr((4,), "int32"), state_indices=arr((3,), "int32"))
    buf = arr((5, 4, 8, 128, 128), "float32", ptr=BASE * 6)
    slots = arr((3,), "int64", ptr=BASE * 7)
    _call(a, **SOFTPLUS_FLAGS._asdict(), state_v_first=True, cu_seqlens=a["cu_seqlens"],
          intermediate_states_buffer=buf, intermediate_state_indices=slots, disable_state_update=disable, stream=7,
          out=arr((1, 12, 8, 128), ptr=BASE * 2))
    ((p, launch_args, _),) = fake_launch
    assert (p.verify_steps, p.verify_slots, p.slot_dtype, p.index_cols) == (4, 5, "int64", 0)
    assert kda_decode.kda_decode_spec(p, 8, 3, "sm_90a").param_dict["VERIFY"] is True
    assert launch_args[23:29] == (BASE * 6, BASE * 7, 8 * 128 * 128, 4, 5, 0 if disable else 1)
    assert launch_args[29:] == (0, 0, 0, 0), "a chain: no parents"
    assert kda_decode.kda_decode_spec(p, 8, 3, "sm_90a").param_dict["TREE"] is False


def test_a_tree_of_drafts_reaches_the_kernel(fake_launch):
    """retrieve_parent_token [N, C] (SGLang's, EAGLE with topk > 1): the TREE kernel gets the
    parents' pointer, both element strides (a view's too) and C; its dtype picks the template's."""
    a = args(B=1, T=12, cu_seqlens=arr((4,), "int32"), state_indices=arr((3,), "int32"))
    buf = arr((5, 4, 8, 128, 128), "float32", ptr=BASE * 6)
    parents = arr((3, 4), "int64", strides=(10, 2), ptr=BASE * 8)   # every other column of a [3, 10] table
    _call(a, **SOFTPLUS_FLAGS._asdict(), state_v_first=True, cu_seqlens=a["cu_seqlens"],
          intermediate_states_buffer=buf, intermediate_state_indices=arr((3,), "int32", ptr=BASE * 7),
          disable_state_update=True, retrieve_parent_token=parents, stream=7, out=arr((1, 12, 8, 128), ptr=BASE * 2))
    ((p, launch_args, _),) = fake_launch
    assert (p.parent_cols, p.parent_dtype) == (4, "int64")
    spec = kda_decode.kda_decode_spec(p, 8, 3, "sm_90a").param_dict
    assert spec["TREE"] is True and spec["PARENT_T"] == "long long" and spec["VERIFY"] is True
    assert launch_args[29:] == (BASE * 8, 10, 2, 4)


def test_plain_decode_has_no_verify():
    p = validate_kda_decode(**args())
    spec = kda_decode.kda_decode_spec(p, 8, 3, "sm_90a")
    assert (p.verify_steps, p.verify_slots) == (0, 0) and spec.param_dict["VERIFY"] is False


@pytest.mark.parametrize("over, message", [
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32")), "go together"),
    (dict(intermediate_state_indices=arr((4,), "int32")), "go together"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "bfloat16"), intermediate_state_indices=arr((4,), "int32")),
     "intermediate_states_buffer must have dtype float32"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 64, 128), "float32"), intermediate_state_indices=arr((4,), "int32")),
     r"intermediate_states_buffer must have shape \[S, steps, H, V, K\]"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32", strides=(5 << 17, 1 << 17, 1 << 14, 128, 1)),
          intermediate_state_indices=arr((4,), "int32")), "strides"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((3,), "int32")),
     r"intermediate_state_indices must have shape \[N\]"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          state_indices=arr((4, 2), "int32")), "takes 1-D state_indices"),
    (dict(intermediate_states_buffer=arr((5, 0, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32")),
     "needs a slot and a step at least"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "float32")),
     "intermediate_state_indices must have dtype int32 or int64"),
    (dict(retrieve_parent_token=arr((4, 4), "int32")), "retrieve_parent_token .* needs intermediate_states_buffer"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          retrieve_parent_token=arr((4, 4), "float32")), "retrieve_parent_token must have dtype int32 or int64"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          retrieve_parent_token=arr((16,), "int32")), "retrieve_parent_token must be 2-D"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          retrieve_parent_token=arr((3, 4), "int32")), r"retrieve_parent_token must have shape \[N, T\]"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          retrieve_parent_token=arr((4, 0), "int32")), "a column per draft token"),
    (dict(intermediate_states_buffer=arr((5, 4, 8, 128, 128), "float32"), intermediate_state_indices=arr((4,), "int32"),
          retrieve_parent_token=arr((4, 4), "int32", device=1)), "one device.*retrieve_parent_token.: 1"),
])
def test_bad_target_verify_arguments_are_named(over, message):
    a = args()
    steps_buffer = over.pop("intermediate_states_buffer", None)
    steps_slots = over.pop("intermediate_state_indices", None)
    parents = over.pop("retrieve_parent_token", None)
    a.update(over)
    with pytest.raises((TypeError, ValueError), match=message):
        validate_kda_decode(**a, steps_buffer=steps_buffer, steps_slots=steps_slots, parents=parents)


def test_disable_state_update_needs_1d_indices(fake_launch):
    a = args(state_indices=arr((4, 2), "int32"))
    with pytest.raises(ValueError, match="disable_state_update goes with 1-D state_indices"):
        _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, disable_state_update=True)
    assert fake_launch == []


def test_disable_state_update_alone_reads_the_pool_only(fake_launch):
    """disable_state_update without a buffer: outputs only (write_back 0), the plain kernel."""
    a = args()
    _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, disable_state_update=True, stream=7,
          out=arr((4, 1, 8, 128), ptr=BASE * 2))
    ((p, launch_args, _),) = fake_launch
    assert p.verify_steps == 0 and launch_args[23:] == (0,) * 10


def test_a_bad_setting_equal_to_a_prepared_good_one_still_raises(fake_launch):
    """Settings are checked when a call is prepared: a later call whose bad 3.0 compares equal to
    the good 3 must not find that prepared call."""
    a, out = args(), arr((4, 1, 8, 128), ptr=BASE * 2)
    _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, out=out, stream=7, stages=3)
    with pytest.raises(ValueError, match=r"stages must be in 2..8; got 3.0 \(an int is needed\)"):
        _call(a, **SAFE_GATE_FLAGS._asdict(), state_v_first=True, out=out, stream=7, stages=3.0)
    assert len(fake_launch) == 1
