"""CPU tests of KDA decode argument checks and planning (no GPU needed)."""
import numpy as np
import pytest

from pykda.ops.kda_decode import (KdaDecodeProblem, check_state_indices, min_ctas, plan_kda_decode, tile_rows,
                                  validate_kda_decode)
from fakes import BASE, device_array as arr



def args(B=4, T=1, H=8, K=128, P=16, state_dtype="float32", **over):
    a = dict(q=arr((B, T, H, K)), k=arr((B, T, H, K)), v=arr((B, T, H, K)), g=arr((B, T, H, K)),
             beta=arr((B, T, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
             state=arr((P, H, K, K), state_dtype), state_indices=arr((B,), "int32"), cu_seqlens=None, out=None)
    a.update(over)
    return a


def test_valid_problem_is_described():
    p = validate_kda_decode(**args())
    assert (p.batch, p.tokens, p.heads, p.dim, p.sequences, p.pool_rows) == (4, 1, 8, 128, 4, 16)
    p = validate_kda_decode(**args(B=1, T=9, cu_seqlens=arr((4,), "int64"), state_indices=arr((3,), "int64"),
                                   dt_bias=arr((8 * 128,), "float32"), state_dtype="bfloat16"))
    assert (p.sequences, p.cu_dtype, p.index_dtype, p.state_dtype) == (3, "int64", "int64", "bfloat16")


@pytest.mark.parametrize("over, exc, message", [
    (dict(state=arr((16, 8, 128, 128), "float16")), TypeError, "initial_state must have dtype float32 or bfloat16"),
    (dict(state=arr((16, 8, 64, 128))), ValueError, r"initial_state must have shape \[P, H, V, K\]"),
    (dict(state=None), ValueError, "initial_state .* is required"),
    (dict(state_indices=arr((4,), "float32")), TypeError, "state_indices must have dtype int32 or int64"),
    (dict(state_indices=arr((5,), "int32")), ValueError, "state_indices must have shape"),
    (dict(q=arr((4, 0, 8, 128)), k=arr((4, 0, 8, 128)), v=arr((4, 0, 8, 128)), g=arr((4, 0, 8, 128)),
          beta=arr((4, 0, 8))), ValueError, "at least one token"),
    (dict(q=arr((2, 2 ** 30, 8, 128)), k=arr((2, 2 ** 30, 8, 128)), v=arr((2, 2 ** 30, 8, 128)),
          g=arr((2, 2 ** 30, 8, 128)), beta=arr((2, 2 ** 30, 8)), state_indices=arr((2,), "int32")),
     ValueError, r"B \* T = 2147483648 tokens; the kernel indexes tokens with 32-bit ints"),
    (dict(q=arr((4, 1, 8, 96))), ValueError, r"head dim K must be one of \(64, 128\); got 96"),
    (dict(q=arr((4, 1, 8, 128), "float16")), TypeError, "q must have dtype bfloat16"),
    (dict(k=arr((4, 1, 8, 64))), ValueError, "k must have shape"),
    (dict(beta=arr((4, 1, 8, 1))), ValueError, "beta must be 3-D"),
    (dict(A_log=arr((8,), "bfloat16")), TypeError, "A_log must have dtype float32"),
    (dict(dt_bias=arr((8, 64), "float32")), ValueError, "dt_bias must have shape"),
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


def test_index_values_checked_on_request():
    check_state_indices(np.array([3, -1, 0, 7]), 8)
    with pytest.raises(ValueError, match="state_indices holds 8, out of range for a pool of 8 rows"):
        check_state_indices(np.array([3, 8]), 8)
    with pytest.raises(ValueError, match=r"state_indices repeats pool rows \[3\]"):
        check_state_indices(np.array([3, -1, 3, -1]), 8)


@pytest.mark.parametrize("state, dim", [("float32", 128), ("float32", 64), ("bfloat16", 128), ("bfloat16", 64)])
def test_plan_fills_the_gpu_and_tiles_v(state, dim):
    for batch in (1, 8, 64, 256):
        p = KdaDecodeProblem(batch, 1, 32, dim, batch, batch, state, "int32", "int32")
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
    p = KdaDecodeProblem(1, 1, 2, 128, 1, 1, "float32", "int32", "int32")
    assert plan_kda_decode(p, 132, 233472).n_tiles >= 132 // 4, "few heads: smaller tiles reach more SMs"


def test_plan_overrides_are_checked():
    p = KdaDecodeProblem(1, 1, 32, 64, 1, 1, "bfloat16", "int32", "int32")
    assert plan_kda_decode(p, 132, 233472, rpt=2, stages=3).stages == 3
    with pytest.raises(ValueError, match="rows_per_thread"):
        plan_kda_decode(p, 132, 233472, rpt=8)   # 128 rows > 64
    with pytest.raises(ValueError, match="rows_per_thread"):
        plan_kda_decode(p, 132, 233472, rpt=3)
