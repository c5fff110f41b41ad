"""KDA decode over a pool of states: `fused_recurrent_kda` (names as in fla).

validate -> plan (rows per CTA) -> spec -> kernel bound to its constants, the layout struct among
them (`prepare_kda_decode`, memoized on the arguments' metadata and the settings) -> launch with
the call's pointers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import runtime
from ..runtime.arrays import CallArrays, contiguous_strides
from .bound import bound_launch
from .kda import check_kda_inputs
from .kda_variant import KdaFlags, KdaVariant, resolve_state_v_first, resolve_variant
from .checks import (check_aligned, check_contiguous, check_dtype, check_inner_contiguous, check_ndim,
                     check_rows_contiguous, check_same_device, check_shape, check_stages, is_int, Memo,
                     prepared_key, resolve_scale)

STATE_CTYPES = {"float32": "float", "bfloat16": "bf16_t"}
INDEX_CTYPES = {"int32": "int", "int64": "long long"}
WARPS = 4             # consumer warps; one more warp produces
RING_STAGES = 3
MAX_STAGED_TOKENS = 8 # tokens per tile whose inputs ride the ring (more are read from global memory)
# the kernel's parameters, in order, as `runtime.signature` gives them: pointers as int, the
# Layout struct (18 int64 strides) by its byte length
KERNEL_SIGNATURE = (int,) * 5 + (18 * 8,) + (int,) * 3 + (np.int32, np.int32, np.int64, int, np.int64, np.int32, int,
                                                          int, np.int32, np.int32, np.int32, int, float, float,
                                                          int, int, np.int64, np.int32, np.int32, np.int32,
                                                          int, np.int64, np.int64, np.int32)
ARGUMENTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "state_indices", "num_accepted_tokens",
             "cu_seqlens", "out", "intermediate_states_buffer", "intermediate_state_indices", "retrieve_parent_token")
REQUIRED = 5   # q .. beta; initial_state is checked by validation, with its own message
OUT = ARGUMENTS.index("out")
# what a call gives its launch anew (runtime.CallValues): the pointers of ARGUMENTS, in this order
CALL_SIGNATURE = (int,) * len(ARGUMENTS)
PER_CALL = {name: runtime.PerCall(i) for i, name in enumerate(ARGUMENTS)}


class KdaDecodeProblem(NamedTuple):
    batch: int          # B (1 with cu_seqlens)
    tokens: int         # T
    heads: int
    dim: int            # K = V
    sequences: int      # N
    pool_rows: int      # P
    state_dtype: str
    index_dtype: str    # of state_indices ('int32' when absent)
    cu_dtype: str       # of cu_seqlens ('int32' when absent)
    variant: KdaVariant  # gate mode, β form, norm flag, dtypes of g and beta
    index_cols: int = 0  # C of 2-D state_indices [N, C] (speculative decode: a row per token); 0 for [N] or none
    accepted_dtype: str = "int32"   # of num_accepted_tokens ('int32' when absent)
    v_first: bool = True            # pool layout [P, H, V, K] (else fla's [P, H, K, V])
    verify_steps: int = 0           # target verify: steps of intermediate_states_buffer [S, steps, H, ., .] (0: none)
    verify_slots: int = 0           # its S
    slot_dtype: str = "int32"       # of intermediate_state_indices ('int32' when absent)
    parent_cols: int = 0            # target verify of a tree: columns of retrieve_parent_token [N, C] (0: a chain)
    parent_dtype: str = "int32"     # its dtype ('int32' when absent)
    packed: bool = False            # tokens packed with cu_seqlens (lengths unknown on the host)


@dataclass(frozen=True)
class KdaDecodePlan:
    rpt: int          # rows per lane group
    stages: int       # shared-memory ring depth, in tiles
    n_tiles: int      # state tiles: sequences x heads x tiles per head
    grid: int         # persistent CTAs
    smem: int         # dynamic shared memory per CTA, bytes
    tensor_cores: bool = False   # kda_decode_mma: one CTA a (sequence, head), the T tokens at once


def lane_groups(p: KdaDecodeProblem) -> int:
    """Lane groups of the consumer warps: a state row takes dim / elems lanes, 16 bytes each."""
    elems = 16 // (4 if p.state_dtype == "float32" else 2)
    return WARPS * (32 // (p.dim // elems))


def tile_rows(p: KdaDecodeProblem, rpt: int) -> int:
    """State rows per tile: every consumer lane holds rpt 16-byte pieces."""
    return lane_groups(p) * rpt


def whole_state_rpt(p: KdaDecodeProblem) -> int:
    """Rows per lane group of a tile that is a whole state (K-first pools: a column sum needs all
    K rows)."""
    return p.dim // lane_groups(p)


def tile_count(p: KdaDecodeProblem, rpt: int) -> int:
    """Tiles of the whole problem: sequences x heads x tiles per state."""
    return p.sequences * p.heads * (p.dim // tile_rows(p, rpt))


def tile_bytes(rpt: int) -> int:
    return WARPS * 32 * 16 * rpt


def min_ctas(state_dtype: str, rpt: int) -> int:
    """CTAs per SM the kernel is compiled for (its register cap), by the fp32 state values a
    lane holds (rpt 16-byte pieces): up to 32 three; 64 (the bf16 pool's 8-row groups) two, more
    than 128 registers; 128 (K-first tiles at K = 128: a whole state on 128 lanes) one."""
    held = rpt * 16 // (4 if state_dtype == "float32" else 2)
    return 3 if held <= 32 else 2 if held <= 64 else 1


def staged_tokens(p: KdaDecodeProblem) -> int:
    """Tokens per tile whose inputs the producer stages: all of them for T <= 8; with
    cu_seqlens (lengths unknown on the host) the mean length, rounded up."""
    per_seq = -(-(p.batch * p.tokens) // p.sequences)
    return max(1, min(MAX_STAGED_TOKENS, per_seq))


def stage_bytes(p: KdaDecodeProblem, rpt: int) -> int:
    """A ring stage (the kernel checks this count against its layout): the state tile; per
    staged token the q, k, v rows (bf16), the g row (bf16 or fp32) and a β word; the head's
    dt_bias row and A_log (fp32, 16 bytes for A_log); per staged token the fp32 decays."""
    t = staged_tokens(p)
    token_bytes = 3 * p.dim * 2 + p.dim * (4 if p.variant.g_dtype == "float32" else 2)
    gate_at = -(-(tile_bytes(rpt) + t * (token_bytes + 4)) // 16) * 16
    return -(-(gate_at + p.dim * 4 + 16 + t * p.dim * 4) // 128) * 128


def sums_bytes(p: KdaDecodeProblem) -> int:
    """K-first pools: the warps' column sums after the ring, [2][WARPS][sk | sq][K] fp32 (none
    V-first)."""
    return 0 if p.v_first else 2 * WARPS * 2 * p.dim * 4


def default_stages(p: KdaDecodeProblem, rpt: int, smem_per_sm: int) -> int:
    """Three stages (a deeper ring only lengthens HBM's queues), fewer if min_ctas CTAs per SM
    cannot hold them."""
    per_cta = smem_per_sm // min_ctas(p.state_dtype, rpt) - 3072 - sums_bytes(p)   # alignment slack, static smem, reserve
    return max(2, min(RING_STAGES, per_cta // stage_bytes(p, rpt)))


@functools.lru_cache(maxsize=256, typed=True)   # (a bad 2.0 must not find the plan of 2)
def plan_kda_decode(p: KdaDecodeProblem, sm_count: int, smem_per_sm: int, rpt: int | None = None,
                    stages: int | None = None) -> KdaDecodePlan:
    """The largest tiles (more rows per thread, fewer tiles in each CTA's chain) that still
    reach a quarter of the SMs (measured: smaller tiles only pay off below that); K-first pools
    take whole states. The grid is as many CTAs as fit the SMs."""
    if not p.v_first:
        whole = whole_state_rpt(p)
        if rpt is not None and not (is_int(rpt) and rpt == whole):
            raise ValueError(f"K-first pools [P, H, K, V] take whole-state tiles: rows_per_thread must be None or "
                             f"{whole} at K = {p.dim} {p.state_dtype}; got {rpt}")
        rpt = whole
    elif rpt is None:
        fits = [r for r in (8, 4, 2, 1) if tile_rows(p, r) <= p.dim]
        rpt = next((r for r in fits if tile_count(p, r) >= sm_count // 4), fits[-1])
    elif not is_int(rpt) or rpt not in (1, 2, 4, 8) or tile_rows(p, rpt) > p.dim:
        raise ValueError(f"rows_per_thread must be 1, 2, 4 or 8 with at most {p.dim} rows per tile; got {rpt!r}")
    stages = stages or default_stages(p, rpt, smem_per_sm)
    smem = stages * stage_bytes(p, rpt) + sums_bytes(p) + 1024   # + alignment slack
    n_tiles = tile_count(p, rpt)
    per_sm = max(1, min(min_ctas(p.state_dtype, rpt), smem_per_sm // (smem + 1024)))
    return KdaDecodePlan(rpt=rpt, stages=stages, n_tiles=n_tiles, grid=min(n_tiles, sm_count * per_sm), smem=smem)


# The tensor-core step (kda_decode_mma): bf16 V-first pools, T tokens a sequence (not packed), the
# state after the last only, 1-D state_indices, no target verify; the planner's choice there for
# MMA_MIN_TOKENS <= T <= MMA_MAX_TOKENS (measured at B 64 H 32 K 128, µs against the recurrent kernel's:
# softplus gate T 2 43.7 / 48.9, T 3 45.8 / 62.4, T 4 47.2 / 76.3, T 8 65.2 / 133.1, and T 1 45.0 / 37.7;
# vLLM's precomputed gate T 2 43.7 / 44.5, T 3 45.6 / 57.1; at B 8 T 2 11.2-11.4 / 11.5-12.4). An explicit
# rows_per_thread or stages keeps the recurrent kernel.
MMA_MIN_TOKENS = 2
MMA_MAX_TOKENS = 8
MMA_SIGNATURE = (int,) * 5 + (18 * 8,) + (int,) * 3 + (np.int32, np.int32, np.int64, int, np.int32, int, float, float,
                                                       np.int32)


def takes_tensor_cores(p: KdaDecodeProblem) -> bool:
    return (p.v_first and p.state_dtype == "bfloat16" and not p.packed and p.index_cols == 0
            and p.verify_steps == 0 and MMA_MIN_TOKENS <= p.tokens <= MMA_MAX_TOKENS)


def mma_min_ctas(tokens: int) -> int:
    """CTAs per SM kda_decode_mma is compiled for: four (64 registers) hold T <= 5 without spills; two
    more (at four, T 6 spills a little and is 2 % slower, T 8 spills 212 bytes and is 20 % slower)."""
    return 4 if tokens <= 5 else 2


def mma_smem_bytes(dim: int, tokens: int) -> int:
    """kda_decode_mma's shared memory (SMEM_BYTES in the template): the state rows at a padded pitch,
    the B operands of both products, Γ, v, β, the column sums' partials and totals."""
    pow2 = lambda n: 1 << max(0, (n - 1).bit_length())   # noqa: E731
    nr = max(pow2(2 * tokens), pow2(tokens * tokens))
    tot_at = dim * (2 * dim + 16) + 2 * 16 * (dim + 8) * 2 + 2 * dim * 8 * 2 + dim * 4 + tokens * dim * 4 + 32 \
        + nr * (dim // 32) * 4
    return tot_at + nr * 4


def plan_tensor_cores(p: KdaDecodeProblem) -> KdaDecodePlan:
    ctas = p.sequences * p.heads
    return KdaDecodePlan(rpt=0, stages=0, n_tiles=ctas, grid=ctas, smem=mma_smem_bytes(p.dim, p.tokens),
                         tensor_cores=True)


@functools.lru_cache(maxsize=256)
def kda_decode_mma_spec(p: KdaDecodeProblem, arch: str) -> runtime.KernelSpec:
    return runtime.KernelSpec.make("kda_decode_mma", {
        "K": p.dim, "T": p.tokens, "MIN_CTAS": mma_min_ctas(p.tokens), "SMEM": mma_smem_bytes(p.dim, p.tokens),
        "IDX_T": INDEX_CTYPES[p.index_dtype],
        **p.variant.template_params()}, arch, kernels=("kda_decode_mma",))


@functools.lru_cache(maxsize=256)
def kda_decode_spec(p: KdaDecodeProblem, rpt: int, stages: int, arch: str) -> runtime.KernelSpec:
    return runtime.KernelSpec.make("kda_decode", {
        "K": p.dim, "STATE": STATE_CTYPES[p.state_dtype], "RPT": rpt, "STAGES": stages, "WARPS": WARPS,
        "MIN_CTAS": min_ctas(p.state_dtype, rpt), "TMAX": staged_tokens(p),
        "STAGE_BYTES": stage_bytes(p, rpt), "IDX_T": INDEX_CTYPES[p.index_dtype],
        "CU_T": INDEX_CTYPES[p.cu_dtype], "SPEC": p.index_cols > 0, "ACC_T": INDEX_CTYPES[p.accepted_dtype],
        "VERIFY": p.verify_steps > 0, "SLOT_T": INDEX_CTYPES[p.slot_dtype], "VFIRST": p.v_first,
        "TREE": p.parent_cols > 0, "PARENT_T": INDEX_CTYPES[p.parent_dtype],
        **p.variant.template_params()}, arch, kernels=("kda_decode",))


def validate_kda_decode(q, k, v, g, beta, A_log, dt_bias, state, state_indices, cu_seqlens, out, flags: KdaFlags,
                        state_v_first: bool, num_accepted_tokens=None, steps_buffer=None,
                        steps_slots=None, parents=None) -> KdaDecodeProblem:
    """Check dtypes, ranks, shapes, layouts and alignment of every argument; no GPU needed."""
    B, T, H, K = check_kda_inputs(q, k, v, g, beta)
    variant = resolve_variant(flags, g, beta, A_log, dt_bias, H, K)
    layout = "[P, H, V, K]" if state_v_first else "[P, H, K, V]"
    if T < 1:
        raise ValueError(f"q must hold at least one token (T >= 1); got T = {T}")
    if B * T >= 2 ** 31:
        raise ValueError(f"q holds B * T = {B * T} tokens; the kernel indexes tokens with 32-bit ints (< 2^31)")
    for name, x in (("q", q), ("k", k), ("g", g), ("v", v)):   # rows copied in 16-byte pieces
        check_inner_contiguous(x, name)
        check_aligned(x, name, 16)
    if state is None:
        raise ValueError(f"initial_state (the state pool {layout}) is required: it is updated in place")
    check_dtype(state, "initial_state", tuple(STATE_CTYPES))
    check_ndim(state, "initial_state", 4, layout)
    P = state.shape[0]
    check_shape(state, "initial_state", (P, H, K, K), layout)
    check_rows_contiguous(state, "initial_state")   # rows any distance apart: a view of a larger cache
    check_aligned(state, "initial_state", 16)
    if cu_seqlens is not None:
        check_dtype(cu_seqlens, "cu_seqlens", tuple(INDEX_CTYPES))
        check_ndim(cu_seqlens, "cu_seqlens", 1, "[N + 1]")
        check_contiguous(cu_seqlens, "cu_seqlens")
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (packed tokens); got B = {B}")
        N = cu_seqlens.shape[0] - 1
        if N < 1:
            raise ValueError("cu_seqlens must hold at least two offsets (one sequence)")
    else:
        N = B
    cols = 0
    if state_indices is not None:
        check_dtype(state_indices, "state_indices", tuple(INDEX_CTYPES))
        if state_indices.ndim == 2:   # speculative decode: a pool row per token
            cols = state_indices.shape[1]
            check_shape(state_indices, "state_indices", (N, cols), "[N, T] (a pool row per sequence and token)")
            check_inner_contiguous(state_indices, "state_indices")
            if cols < 1 or (cu_seqlens is None and cols < T):
                raise ValueError(f"state_indices [N, C] needs a column per token (C >= T = {T}"
                                 f"{'' if cu_seqlens is None else ', at least 1 with cu_seqlens'}); got C = {cols}")
        else:
            check_shape(state_indices, "state_indices", (N,), "[N] (one pool row per sequence) or [N, T]")
            check_contiguous(state_indices, "state_indices")
    elif P < N:
        raise ValueError(f"without state_indices sequence n uses pool row n: initial_state needs "
                         f"at least {N} rows; got {P}")
    if num_accepted_tokens is not None:
        if cols == 0:
            raise ValueError("num_accepted_tokens needs 2-D state_indices [N, T] (speculative decode: the step "
                             "starts from row state_indices[n, num_accepted_tokens[n] - 1])")
        check_dtype(num_accepted_tokens, "num_accepted_tokens", tuple(INDEX_CTYPES))
        check_shape(num_accepted_tokens, "num_accepted_tokens", (N,), "[N]")
        check_contiguous(num_accepted_tokens, "num_accepted_tokens")
    if out is not None:
        check_shape(out, "out", (B, T, H, K), "[B, T, H, V]")
        check_dtype(out, "out", ("bfloat16",))
        check_inner_contiguous(out, "out")
    steps, slots = check_steps_buffer(steps_buffer, steps_slots, state, N, H, K, cols, layout)
    parent_cols = check_parents(parents, steps, N)
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": state}
    for name, a in (("A_log", A_log), ("dt_bias", dt_bias), ("state_indices", state_indices),
                    ("num_accepted_tokens", num_accepted_tokens), ("cu_seqlens", cu_seqlens), ("out", out),
                    ("intermediate_states_buffer", steps_buffer), ("intermediate_state_indices", steps_slots),
                    ("retrieve_parent_token", parents)):
        if a is not None:
            arrays[name] = a
    check_same_device(arrays)
    return KdaDecodeProblem(batch=B, tokens=T, heads=H, dim=K, sequences=N, pool_rows=P,
                            state_dtype=state.dtype,
                            index_dtype=state_indices.dtype if state_indices is not None else "int32",
                            cu_dtype=cu_seqlens.dtype if cu_seqlens is not None else "int32", variant=variant,
                            index_cols=cols,
                            accepted_dtype=num_accepted_tokens.dtype if num_accepted_tokens is not None else "int32",
                            v_first=bool(state_v_first), verify_steps=steps, verify_slots=slots,
                            slot_dtype=steps_slots.dtype if steps_slots is not None else "int32",
                            parent_cols=parent_cols, parent_dtype=parents.dtype if parents is not None else "int32",
                            packed=cu_seqlens is not None)


def check_steps_buffer(buf, slots_of, state, N: int, H: int, K: int, cols: int, layout: str) -> tuple[int, int]:
    """Target verify's arguments: intermediate_states_buffer [S, steps, H, ., .] in the pool's
    dtype and layout (rows contiguous) and intermediate_state_indices [N] (a buffer slot per
    sequence), both or neither, with 1-D state_indices. Returns (steps, S); (0, 0) without."""
    if (buf is None) != (slots_of is None):
        raise ValueError("intermediate_states_buffer and intermediate_state_indices go together (the buffer and "
                         "each sequence's slot in it)")
    if buf is None:
        return 0, 0
    if cols:
        raise ValueError("intermediate_states_buffer (target verify) takes 1-D state_indices [N]: each sequence "
                         "starts from its pool row; 2-D state_indices are the other speculative form")
    check_dtype(buf, "intermediate_states_buffer", (state.dtype,))
    blayout = "[S, steps, " + layout[4:]
    check_ndim(buf, "intermediate_states_buffer", 5, blayout)
    S, steps = buf.shape[:2]
    check_shape(buf, "intermediate_states_buffer", (S, steps, H, K, K), blayout)
    if steps < 1 or S < 1:
        raise ValueError(f"intermediate_states_buffer needs a slot and a step at least; got shape {tuple(buf.shape)}")
    row = H * K * K   # a step's states, contiguous; the steps of a slot, then the slots, rows apart
    if tuple(buf.strides[2:]) != contiguous_strides((H, K, K)) or buf.strides[1] < row or \
            (S > 1 and buf.strides[0] != steps * buf.strides[1]):
        raise ValueError(f"intermediate_states_buffer must be contiguous within each step, its slots' steps "
                         f"rows of one stride (strides[0] == steps * strides[1] >= steps * {row}); got strides "
                         f"{tuple(buf.strides)}")
    check_aligned(buf, "intermediate_states_buffer", 16)
    check_dtype(slots_of, "intermediate_state_indices", tuple(INDEX_CTYPES))
    check_shape(slots_of, "intermediate_state_indices", (N,), "[N] (a buffer slot per sequence)")
    check_contiguous(slots_of, "intermediate_state_indices")
    return steps, S


def check_parents(parents, steps: int, N: int) -> int:
    """A tree of drafts (SGLang's retrieve_parent_token [N, C], int32/int64, any strides): only in
    target verify, whose buffer holds the parents' states. Returns C; 0 without."""
    if parents is None:
        return 0
    if not steps:
        raise ValueError("retrieve_parent_token (a tree of drafts) needs intermediate_states_buffer and "
                         "intermediate_state_indices: a token starts from its parent's state, stored there")
    check_dtype(parents, "retrieve_parent_token", tuple(INDEX_CTYPES))
    check_ndim(parents, "retrieve_parent_token", 2, "[N, T] (each token's parent, -1 for a root)")
    check_shape(parents, "retrieve_parent_token", (N, parents.shape[1]), "[N, T] (a row per sequence)")
    if parents.shape[1] < 1:
        raise ValueError("retrieve_parent_token needs a column per draft token; got 0 columns")
    return parents.shape[1]


def check_state_indices(indices: np.ndarray, pool_rows: int, first_row: int = 0) -> None:
    """Host-side check of state_indices values (the `check_indices=True` debug mode): indices
    from first_row on (the others are padding) must be < pool_rows and distinct."""
    live = indices[indices >= first_row]
    if live.size and live.max() >= pool_rows:
        raise ValueError(f"state_indices holds {int(live.max())}, out of range for a pool of {pool_rows} rows")
    uniq, counts = np.unique(live, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"state_indices repeats pool rows {uniq[counts > 1].tolist()[:8]}: two sequences "
                         f"cannot update one state in place")


def plan_for(p: KdaDecodeProblem, device: int, rpt: int | None, stages: int | None
             ) -> tuple[KdaDecodePlan, runtime.KernelSpec]:
    """The plan of problem `p` on `device` (its shared memory within the device's) and the
    spec of its kernel: the tensor-core step where it applies and no override asks for tiles."""
    dev = runtime.device_info(device)
    if rpt is None and stages is None and takes_tensor_cores(p):
        return plan_tensor_cores(p), kda_decode_mma_spec(p, dev.arch)
    plan = plan_kda_decode(p, dev.sm_count, dev.smem_per_sm, rpt, stages)
    if plan.smem > dev.smem_per_block_optin:
        raise ValueError(f"stages={plan.stages} needs {plan.smem} bytes of shared memory per block; "
                         f"the device allows {dev.smem_per_block_optin}")
    return plan, kda_decode_spec(p, plan.rpt, plan.stages, dev.arch)


class KdaDecodeCall(NamedTuple):
    """A prepared call: what its launch needs besides the pointers and the stream."""
    problem: KdaDecodeProblem
    plan: KdaDecodePlan
    values: runtime.CallValues   # the buffer of the pointers (PER_CALL) the launch reads
    launches: tuple              # the kernel, bound to its constants


def prepare_kda_decode(q, k, v, g, beta, A_log, dt_bias, state, state_indices, num_accepted_tokens, cu_seqlens, out,
                       steps_buffer, steps_slots, parents, scale, flags, state_v_first, rows_per_thread, stages,
                       disable_state_update, first_row) -> KdaDecodeCall:
    """Validate a call and make everything its launch needs but the pointers and the stream: the
    kernel (compiled on first use) bound to its constants. The output, when `out` is None, is a
    new contiguous array of v's shape. `flags`: KdaFlags or a tuple of its fields (the hot path's
    key holds a plain tuple). `first_row`: pool rows below it are padding, as negative indices."""
    p = validate_kda_decode(q, k, v, g, beta, A_log, dt_bias, state, state_indices, cu_seqlens, out, KdaFlags(*flags),
                            state_v_first, num_accepted_tokens, steps_buffer, steps_slots, parents)
    if disable_state_update and p.index_cols:
        raise ValueError("disable_state_update goes with 1-D state_indices: with 2-D ones the pool rows written are "
                         "the caller's choice already")
    scale = resolve_scale(scale, p.dim)
    check_stages(stages)
    runtime.require_gpu()
    plan, spec = plan_for(p, q.device, rows_per_thread, stages)
    o_strides = out.strides if out is not None else contiguous_strides(tuple(v.shape))
    # 3 strides of each [B, T, H, ...] array, beta's all
    layout = np.asarray(q.strides[:3] + k.strides[:3] + g.strides[:3] + v.strides[:3] + tuple(beta.strides)
                        + tuple(o_strides[:3]), dtype=np.int64).tobytes()
    at = PER_CALL   # at["q"]: the argument the launch reads from the call's pointer of q
    i32, i64 = np.int32, np.int64
    values = runtime.CallValues(CALL_SIGNATURE)
    if plan.tensor_cores:
        args = (at["q"], at["k"], at["g"], at["v"], at["beta"], layout, at["A_log"], at["dt_bias"],
                at["initial_state"], i32(p.pool_rows), i32(first_row), i64(state.strides[0]), at["state_indices"],
                i32(p.heads),
                at["out"], p.variant.lower_bound, scale, i32(not disable_state_update))
        launch = bound_launch(spec, q.device, values, "kda_decode_mma", MMA_SIGNATURE, args, (plan.grid, 1, 1),
                              2 * p.dim, plan.smem)
        return KdaDecodeCall(p, plan, values, (launch,))
    args = (at["q"], at["k"], at["g"], at["v"], at["beta"], layout, at["A_log"], at["dt_bias"], at["initial_state"],
            i32(p.pool_rows), i32(first_row), i64(state.strides[0]), at["state_indices"],
            i64(state_indices.strides[0] if p.index_cols else 0), i32(p.index_cols), at["num_accepted_tokens"],
            at["cu_seqlens"], i32(p.tokens), i32(p.heads), i32(plan.n_tiles), at["out"], p.variant.lower_bound, scale,
            at["intermediate_states_buffer"], at["intermediate_state_indices"],
            i64(steps_buffer.strides[1] if p.verify_steps else 0), i32(p.verify_steps), i32(p.verify_slots),
            i32(not disable_state_update), at["retrieve_parent_token"],
            *(i64(x) for x in (parents.strides if p.parent_cols else (0, 0))), i32(p.parent_cols))
    launch = bound_launch(spec, q.device, values, "kda_decode", KERNEL_SIGNATURE, args, (plan.grid, 1, 1),
                          (WARPS + 1) * 32, plan.smem)
    return KdaDecodeCall(p, plan, values, (launch,))


# prepared calls by the arguments' key (CallArrays) and the settings: a repeated call is one key compare
PREPARED = Memo(lambda arrays, settings: prepare_kda_decode(*arrays.views(), *settings))


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale: float | None = None, initial_state=None,
                        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                        use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                        allow_neg_eigval: bool = False, lower_bound: float | None = None, state_v_first: bool = False,
                        cu_seqlens=None, *, safe_gate: bool = False, state_indices=None, ssm_state_indices=None,
                        num_accepted_tokens=None, inplace_final_state: bool = True, out=None, stream=None,
                        check_indices: bool = False, rows_per_thread: int | None = None, stages: int | None = None,
                        transpose_state_layout: bool | None = None, intermediate_states_buffer=None,
                        intermediate_state_indices=None, disable_state_update: bool = False,
                        retrieve_parent_token=None, first_row: int = 0):
    """One or a few KDA recurrent steps per sequence, updating a pool of states in place; fla's
    `fused_recurrent_kda` arguments (gate modes, β forms and the norm flag as in `chunk_kda`).

    q, k [B, T, H, K], v [B, T, H, V] bf16; g [B, T, H, K] and beta [B, T, H] bf16 or fp32;
    A_log (H fp32 elements, any shape) and dt_bias (H*K fp32) where the gate is computed in the
    kernel; K = V in {64, 128}. initial_state is the pool, fla's K-first [P, H, K, V] or with
    `state_v_first=True` (or fla's deprecated `transpose_state_layout=True`) [P, H, V, K] (fp32
    or bf16; either layout read and written as it is, no transposing copy), and is updated in
    place: unlike fla, the call always writes the new states back into it. state_indices [N]
    (int32/int64) picks each sequence's row, a negative index marks a padding slot (zero outputs,
    no state touched); without it sequence n uses row n. With cu_seqlens [N + 1] the tokens are
    packed (B = 1). Tokens of a sequence are applied in order, one output per token.
    Returns (o [B, T, H, V], the pool if `output_final_state` else None).

    Speculative decode (fla's serving forward and vLLM: `ssm_state_indices` is another name for
    `state_indices`, `inplace_final_state` must stay True): 2-D state_indices [N, C] (C >= T, any
    C >= 1 with cu_seqlens; last dim contiguous) store the state after token t of sequence n into
    row [n, t] (nothing where negative; tokens past C store nothing), and the step starts from row
    [n, num_accepted_tokens[n] - 1] (num_accepted_tokens [N] int32/int64; without it column 0).
    A negative start row, or num_accepted_tokens outside 1..C, makes sequence n padding.

    Target verify (SGLang's `fused_sigmoid_gating_delta_rule_update` arguments, with 1-D
    state_indices): `intermediate_states_buffer` [S, steps, H, ., .] (the pool's dtype and layout)
    receives the state after token t < steps of sequence n at [intermediate_state_indices[n], t]
    (intermediate_state_indices [N] int32/int64; nothing where outside 0..S-1), and with
    `disable_state_update=True` the pool is read, not written. A tree of drafts (SGLang's
    `retrieve_parent_token` [N, C] int32/int64, any strides): token t > 0 of sequence n starts
    from the state after token p = retrieve_parent_token[n, t], as stored in the buffer; p = -1
    (any p outside 0..t-1) marks a root, which starts from the sequence's pool row. Tokens past
    C, a parent past the buffer's steps, or a sequence without a buffer slot continue from the
    token before (the buffer holds no parent state for them).

    `first_row` (0 or more): indices below it mark padding too, the rows below it are never read
    or written (vLLM keeps row 0 of its pools as the null block of padded slots: first_row=1).

    Contract: indices >= first_row (all entries of a 2-D one) are distinct and < P; the kernel never reads or
    writes outside the pool (an index >= P is treated as padding), and `check_indices=True`
    verifies both on the host (a synchronisation, so not for CUDA-graph capture).
    `rows_per_thread` (state rows per lane group: 1, 2, 4, 8; K-first pools take whole states,
    K / lane groups) and `stages` (ring depth in tiles) override the planner, for sweeps.
    """
    if ssm_state_indices is not None:
        if state_indices is not None:
            raise ValueError("pass state_indices or ssm_state_indices (fla's name for it), not both")
        state_indices = ssm_state_indices
    state_v_first = resolve_state_v_first(state_v_first, transpose_state_layout)
    if not inplace_final_state:
        raise ValueError("inplace_final_state=False is not supported: fused_recurrent_kda updates the pool "
                         "initial_state in place")
    if not is_int(first_row) or first_row < 0:
        raise ValueError(f"first_row must be a non-negative int; got {first_row!r}")
    first_row = int(first_row)   # (a NumPy int keys the prepared call as the same Python int)
    arrays = CallArrays((q, k, v, g, beta, A_log, dt_bias, initial_state, state_indices, num_accepted_tokens,
                         cu_seqlens, out, intermediate_states_buffer, intermediate_state_indices, retrieve_parent_token),
                        ARGUMENTS, REQUIRED)
    settings = (scale, (use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        safe_gate, lower_bound), state_v_first, rows_per_thread, stages,   # flags: KdaFlags' fields
                bool(disable_state_update), first_row)
    call = PREPARED.get(prepared_key(arrays.key, settings, (rows_per_thread, stages)), arrays, settings)
    if check_indices and state_indices is not None:
        import cupy
        check_state_indices(cupy.asnumpy(cupy.from_dlpack(state_indices)), call.problem.pool_rows, first_row)
    strm = arrays.stream(stream)
    ptrs = arrays.ptrs   # of ARGUMENTS, 0 for None
    if out is None:   # o has v's shape and dtype
        out, o_p = arrays.new_contiguous_like(2)
        ptrs = (*ptrs[:OUT], o_p, *ptrs[OUT + 1:])
    call.values.launch(ptrs, call.launches, strm)
    return arrays.result(out), (initial_state if output_final_state else None)
