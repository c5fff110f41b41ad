"""Kimi Delta Attention prefill: `chunk_kda` (fla's argument names, FlashKDA's fusions).

validate -> plan (V split, pipeline) -> specs -> kernels -> workspace + tensor map -> launch:

1. `kda_chunk_offsets` (varlen only, one CTA): chunk_off[n] = Σ_{m<n} ceil(len_m / C) on the
   device, so that no host synchronisation is needed (a call can be captured in a CUDA graph).
2. `kda_prepare`, grid (chunk slots, H): token-parallel per (chunk, head) — L2 norm, gate,
   sigmoid(beta), fp32 cumsum, decayed q/k, L and Mqk (mma.sync), (I + L)^-1 — one record per
   (chunk, head) in the workspace.
3. `kda_recurrence`, grid (V / VS, H, N): the chunk recurrence with an fp32 state slice of
   VS rows on chip, fed by a TMA/bulk-copy pipeline.

cu_seqlens contract (its values live on the device and are never read by the host, so they are
not checked — only dtype, rank, contiguity and B = 1 are): non-decreasing values within [0, T].
fla's convention (start at 0, end at T) is the usual case; gaps at either end are allowed and
those output rows are never written. The kernels clamp every sequence into [0, T] with a
non-negative length, so a malformed cu_seqlens (decreasing, out of range) can never make them
access memory out of bounds, but the results for such input are undefined.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..runtime.arrays import DeviceArray, as_device_array, empty_like_framework, launch_stream, to_framework
from .checks import (check_aligned, check_contiguous, check_dtype, check_inner_contiguous, check_ndim, check_same_device, check_shape, check_stages, resolve_scale)
from .kda_variant import KdaFlags, KdaVariant, resolve_variant

HEAD_DIMS = (64, 128)
CHUNK_SIZES = (16, 32)
STATE_DTYPES = ("float32", "bfloat16")
CU_DTYPES = ("int32", "int64")
PREP_THREADS = 128
# kda_prepare's growth-factor form takes a chunk whose log2-decay G_C stays >= -GROWTH_LIMIT on
# every key dim (2^-G fits fp32 and bf16); other chunks take the growth-free form
GROWTH_LIMIT = 120.0
MAX_SEQUENCES = 65535          # grid z of kda_recurrence
DEFAULT_STAGES = {16: 4, 32: 3}
SPLIT_S = False                # state split into bf16 hi + lo for S·kdᵀ and S·qdᵀ


def record_bytes(K: int, C: int) -> int:
    """Bytes of one (chunk, head) workspace record (KdaRecord<K, C> in kda_chunk.cuh)."""
    return 3 * C * K * 2 + 2 * C * C * 2 + K * 4


def prepare_smem_bytes(K: int, C: int, bounded: bool) -> int:
    """All of kda_prepare's shared memory is dynamic (SMEM_BYTES in the template)."""
    return (3 if bounded else 4) * C * (K + 8) * 4 + C * (C + 1) * 4 + K * 4 + C * 4 + 2 * C * C * 2


def bounded_gate(p: "KdaProblem") -> bool:
    """The gate cannot take a chunk's log2-decay below -GROWTH_LIMIT: kda_prepare needs only its
    growth-factor form."""
    v = p.variant
    return v.gate == "safe" and v.lower_bound * p.chunk * math.log2(math.e) >= -GROWTH_LIMIT


def _above_static_margin(smem: int) -> int:
    """Dynamic smem just under 48 KB plus a kernel's static smem can exceed the default limit
    without the opt-in the launcher only sets above 48 KB: step over that gap."""
    return 48 * 1024 + 16 if 48 * 1024 - 512 < smem <= 48 * 1024 else smem


def recurrence_smem_bytes(K: int, C: int, warps: int, stages: int) -> int:
    vtile = C * 16 * warps * 2
    stage = -(-(-(-vtile // 128) * 128 + record_bytes(K, C)) // 128) * 128
    return stages * stage + warps * C * 16 * 2 + 1024


@dataclass(frozen=True)
class KdaProblem:
    batch: int            # B
    seq_len: int          # T
    heads: int            # H
    head_dim: int         # K = V
    n_seq: int            # N
    varlen: bool
    chunk: int            # C
    state_dtype: str      # of the states (float32 when none is given)
    variant: KdaVariant   # gate mode, β form, norm flag, dtypes of g and beta
    v_first: bool         # states [.., V, K] (else fla's [.., K, V])
    pool_rows: int        # rows of the state arrays (N, or the pool's P with state_indices)


@dataclass(frozen=True)
class KdaPlan:
    warps: int            # consumer warps per recurrence CTA; VS = 16·warps state rows
    stages: int
    chunk_slots: int      # grid x of kda_prepare (an upper bound on the chunk count with varlen)
    prep_smem: int
    rec_smem: int

    @property
    def v_split(self) -> int:
        return 16 * self.warps


def plan_kda(p: KdaProblem, sm_count: int, warps: int | None = None, stages: int | None = None) -> KdaPlan:
    """Split V across CTAs until sequences x heads x splits covers ~all SMs (90%; 16 rows minimum)."""
    K, C = p.head_dim, p.chunk
    if warps is None:
        options = [w for w in (8, 4, 2, 1) if 16 * w <= K]
        warps = next((w for w in options if p.n_seq * p.heads * (K // (16 * w)) >= 0.9 * sm_count), options[-1])
    if warps not in (1, 2, 4, 8) or 16 * warps > K:
        raise ValueError(f"warps must be 1, 2, 4 or 8 with 16·warps <= {K}; got {warps}")
    stages = stages or DEFAULT_STAGES[C]
    cps = -(-p.seq_len // C)
    slots = cps + p.n_seq if p.varlen else p.batch * cps
    return KdaPlan(warps=warps, stages=stages, chunk_slots=slots,
                   prep_smem=_above_static_margin(prepare_smem_bytes(K, C, bounded_gate(p))),
                   rec_smem=_above_static_margin(recurrence_smem_bytes(K, C, warps, stages)))


def kda_specs(p: KdaProblem, plan: KdaPlan, arch: str, split_s: bool | None = None) -> tuple[runtime.KernelSpec, ...]:
    split_s = SPLIT_S if split_s is None else split_s
    prep = runtime.KernelSpec.make("kda_prepare", {"K": p.head_dim, "C": p.chunk, "GROWTH_LIMIT": GROWTH_LIMIT,
                                                   "BOUNDED": bounded_gate(p), **p.variant.template_params()},
                                   arch, kernels=("kda_chunk_offsets", "kda_prepare"))
    rec = runtime.KernelSpec.make("kda_recurrence", {"K": p.head_dim, "C": p.chunk, "WARPS": plan.warps,
                                                     "STAGES": plan.stages, "SPLIT_S": bool(split_s),
                                                     "VFIRST": p.v_first},
                                  arch, kernels=("kda_recurrence",))
    return prep, rec


def check_kda_inputs(q: DeviceArray, k: DeviceArray, v: DeviceArray, g: DeviceArray,
                     beta: DeviceArray) -> tuple[int, int, int, int]:
    """Ranks, dtypes and shapes of KDA's per-token inputs, shared by prefill and decode (g's and
    beta's dtypes are the variant's: `resolve_variant`); returns (B, T, H, K). Layout and
    alignment are each op's own."""
    layout = "[B, T, H, K]"
    for name, a in (("q", q), ("k", k), ("g", g)):
        check_ndim(a, name, 4, layout)
    check_ndim(v, "v", 4, "[B, T, H, V]")
    check_ndim(beta, "beta", 3, "[B, T, H]")
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_dtype(a, name, ("bfloat16",))
    B, T, H, K = q.shape
    if K not in HEAD_DIMS:
        raise ValueError(f"head dim K must be one of {HEAD_DIMS}; got {K}")
    for name, a in (("k", k), ("g", g)):
        check_shape(a, name, (B, T, H, K), layout)
    if tuple(v.shape[:2]) == (B, T) and v.shape[2] != H:
        raise ValueError(f"v has {v.shape[2]} heads and q {H}: grouped value heads (HV > H) are not supported")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H = {(B, T, H)}; got {tuple(v.shape)}")
    if v.shape[3] != K:
        raise ValueError(f"v's head dim V ({v.shape[3]}) must equal q's head dim K ({K})")
    check_shape(beta, "beta", (B, T, H), "[B, T, H]")
    return B, T, H, K


def validate_kda(q: DeviceArray, k: DeviceArray, v: DeviceArray, g: DeviceArray, beta: DeviceArray,
                 A_log: DeviceArray | None, dt_bias: DeviceArray | None, initial_state: DeviceArray | None,
                 state_indices: DeviceArray | None, has_initial_state: DeviceArray | None,
                 cu_seqlens: DeviceArray | None, out: DeviceArray | None, final_state: DeviceArray | None,
                 flags: KdaFlags, state_v_first: bool, chunk_size: int) -> KdaProblem:
    """Check dtypes, ranks, shapes, layouts, alignment and ranges; no GPU needed, no values read."""
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}; got {chunk_size}")
    B, T, H, K = check_kda_inputs(q, k, v, g, beta)
    variant = resolve_variant(flags, g, beta, A_log, dt_bias, H, K)
    if H < 1 or H > 65535:
        raise ValueError(f"the number of heads H must be in 1..65535; got {H}")
    for name, a in (("q", q), ("k", k), ("v", v), ("g", g)):
        check_inner_contiguous(a, name)
        check_aligned(a, name, 16)

    if cu_seqlens is not None:
        check_dtype(cu_seqlens, "cu_seqlens", CU_DTYPES)
        if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1; got shape {tuple(cu_seqlens.shape)}")
        check_contiguous(cu_seqlens, "cu_seqlens")
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size B must be 1 (sequences are packed along T); got B={B}")
        N = cu_seqlens.shape[0] - 1
        if N > MAX_SEQUENCES:
            raise ValueError(f"cu_seqlens holds {N} sequences; at most {MAX_SEQUENCES} are supported")
    else:
        N = B
        if B > MAX_SEQUENCES:
            raise ValueError(f"batch size B={B} exceeds {MAX_SEQUENCES}")
    state_layout = "[N, H, V, K]" if state_v_first else "[N, H, K, V]"
    rows = N
    if state_indices is not None:
        if initial_state is None:
            raise ValueError("state_indices picks rows of the state pool: pass the pool as initial_state")
        if final_state is not None:
            raise ValueError("with state_indices the final states go back into the pool rows (initial_state); "
                             "final_state must not be given")
        check_dtype(state_indices, "state_indices", CU_DTYPES)
        check_shape(state_indices, "state_indices", (N,), "[N] (one pool row per sequence)")
        check_contiguous(state_indices, "state_indices")
        check_ndim(initial_state, "initial_state", 4, state_layout.replace("N", "P"))
        rows = initial_state.shape[0]
        state_layout = state_layout.replace("N", "P")
    if has_initial_state is not None:
        check_dtype(has_initial_state, "has_initial_state", ("bool",))
        check_shape(has_initial_state, "has_initial_state", (N,), "[N]")
        check_contiguous(has_initial_state, "has_initial_state")
    state_dtype = None
    for name, s in (("initial_state", initial_state), ("final_state", final_state)):
        if s is None:
            continue
        check_dtype(s, name, STATE_DTYPES)
        check_shape(s, name, (rows, H, K, K), state_layout)
        check_contiguous(s, name)
        check_aligned(s, name, 8)
        if state_dtype is not None and s.dtype != state_dtype:
            raise TypeError(f"final_state must have the dtype of initial_state ({state_dtype}); got {s.dtype}")
        state_dtype = s.dtype
    if out is not None:
        check_dtype(out, "out", ("bfloat16",))
        check_shape(out, "out", (B, T, H, K), "[B, T, H, V]")
        check_inner_contiguous(out, "out")
        check_aligned(out, "out", 16)
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, a in (("A_log", A_log), ("dt_bias", dt_bias), ("initial_state", initial_state),
                    ("state_indices", state_indices), ("has_initial_state", has_initial_state),
                    ("cu_seqlens", cu_seqlens), ("out", out), ("final_state", final_state)):
        if a is not None:
            arrays[name] = a
    check_same_device(arrays)
    return KdaProblem(batch=B, seq_len=T, heads=H, head_dim=K, n_seq=N, varlen=cu_seqlens is not None,
                      chunk=chunk_size, state_dtype=state_dtype or "float32", variant=variant,
                      v_first=bool(state_v_first), pool_rows=rows)


def v_tensor_map(v: DeviceArray, vs: int, chunk: int) -> np.ndarray:
    """4-D map (V, H, T, B) over v in place, box (VS, 1, C, 1); rows past T read as zeros."""
    B, T, H, V = v.shape
    sb, st, sh = (s * 2 for s in v.strides[:3])
    # size-1 dims: any valid stride will do (never stepped over)
    sh = sh if H > 1 else V * 2
    st = st if T > 1 else max(sh * H, 16)
    sb = sb if B > 1 else max(st * T, 16)
    return runtime.encode_tiled("v", "bfloat16", v.ptr, (V, H, T, B), (sh, st, sb), (vs, 1, chunk, 1))


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: float | None = None, state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None,
              *, A_log=None, dt_bias=None, state_indices=None, has_initial_state=None, out=None, final_state=None,
              chunk_size: int = 16, stream=None, warps: int | None = None, stages: int | None = None,
              disable_recompute: bool = False, use_graph: bool = False, max_num_seqs: int | None = None,
              return_intermediate_states: bool = False, cp_context=None):
    """Chunked Kimi Delta Attention forward (prefill), with fla's `chunk_kda` arguments.

    q, k: [B, T, H, K] bf16; v: [B, T, H, V] bf16; g: [B, T, H, K] bf16 or fp32; beta: [B, T, H]
    bf16 or fp32; read in place (q, k, v, g: last dim contiguous, 16-byte aligned strides).
    K = V in {64, 128}; `scale` defaults to K^-0.5.
    - `use_qk_l2norm_in_kernel`: L2-normalise q and k in the kernel.
    - Gate (kda_variant.py): `use_gate_in_kernel=False` takes g as the log-decay; `True` computes
      Kimi Linear's `-exp(A_log) * softplus(g + dt_bias)` (unbounded: any decay, 0 included), or
      with `lower_bound` (and `safe_gate`) `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`.
      A_log: H fp32 elements in any shape ([H], [1, 1, H, 1]); dt_bias: H*K fp32 ([H, K], [H*K]).
    - β: probabilities, or logits with `use_beta_sigmoid_in_kernel` (2·sigmoid with `allow_neg_eigval`).
    - States: [N, H, K, V] (fla's layout) or [N, H, V, K] with `state_v_first=True`, fp32 or bf16.
      `initial_state` (None: zeros); the final state is returned when `output_final_state` or
      when `final_state` (a buffer to fill, which may be `initial_state` itself) is given; it has
      initial_state's dtype (fp32 when none is given).
    - State pool: with `state_indices` [N] (int32/int64), `initial_state` is a pool [P, H, ., .]:
      sequence n starts from row state_indices[n] and its final state is written back into that
      row, in place (returned final state: the pool). A negative index (padding) or one >= P
      reads zeros and writes nothing. `has_initial_state` [N] bool: where False, the sequence
      starts from zeros (its row is still written).
    - `cu_seqlens` (int32/int64 on the device, [N + 1], B = 1): packed variable-length sequences;
      see the module docstring for its contract. Output rows outside the sequences are never
      written. `cu_seqlens_cpu`, `use_graph`, `max_num_seqs` and `disable_recompute` are accepted
      for fla's callers and change nothing: the values of cu_seqlens are never read by the host,
      so every call can be captured in a CUDA graph.
    - `chunk_size` 16 or 32; `warps`, `stages` override the planner.
    Returns (o [B, T, H, V] bf16 in q's framework (or `out`), final_state or None).
    """
    if cp_context is not None:
        raise ValueError("cp_context (fla's context parallelism) is not supported by chunk_kda")
    if return_intermediate_states:
        raise ValueError("return_intermediate_states is not supported yet")
    del cu_seqlens_cpu, disable_recompute, use_graph, max_num_seqs   # nothing to do with them (see above)
    flags = KdaFlags(bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel), bool(use_beta_sigmoid_in_kernel),
                     bool(allow_neg_eigval), bool(safe_gate), lower_bound)
    qa, ka, va, ga, ba = (as_device_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")))
    opt = {name: (as_device_array(x, name) if x is not None else None) for name, x in (
        ("A_log", A_log), ("dt_bias", dt_bias), ("initial_state", initial_state), ("state_indices", state_indices),
        ("has_initial_state", has_initial_state), ("cu_seqlens", cu_seqlens), ("out", out), ("final_state", final_state))}
    p = validate_kda(qa, ka, va, ga, ba, *opt.values(), flags, state_v_first, chunk_size)
    Aa, da, s0, idx, hia, cua, oa, fa = opt.values()
    scale = resolve_scale(scale, p.head_dim)
    check_stages(stages)
    runtime.require_gpu()
    dev = runtime.device_info(qa.device)
    plan = plan_kda(p, dev.sm_count, warps, stages)
    if max(plan.rec_smem, plan.prep_smem) > dev.smem_per_block_optin:
        raise ValueError(f"the plan needs {max(plan.rec_smem, plan.prep_smem)} bytes of shared memory per "
                         f"block; the device allows {dev.smem_per_block_optin} (use fewer stages)")
    prep_spec, rec_spec = kda_specs(p, plan, dev.arch)
    strm = launch_stream(qa, stream)

    B, T, H, K, N, C = p.batch, p.seq_len, p.heads, p.head_dim, p.n_seq, p.chunk
    pooled = idx is not None
    want_final = output_final_state or final_state is not None or pooled
    if out is None:
        out = empty_like_framework(qa, (B, T, H, K), "bfloat16")
        oa = as_device_array(out, "out")
    if pooled:
        final_state, fa = initial_state, s0
    elif want_final and final_state is None:
        final_state = empty_like_framework(qa, (N, H, K, K), p.state_dtype)
        fa = as_device_array(final_state, "final_state")
    # returned: the pool only when asked for; a final_state buffer the caller gave, always
    returned = final_state if (output_final_state or not pooled) and want_final else None
    returned = to_framework(qa, returned) if returned is not None else None
    if N == 0:   # an empty batch: nothing to compute
        return to_framework(qa, out), returned

    off_bytes = -(-(N + 1) * 4 // 256) * 256 if p.varlen else 0
    ws_owner, ws = runtime.workspace(q, strm, off_bytes + plan.chunk_slots * H * record_bytes(K, C) + 16)   # held to the last launch
    chunk_off, records = (ws if p.varlen else 0), ws + off_bytes
    cu_ptr, cu_is64 = (cua.ptr, int(cua.dtype == "int64")) if p.varlen else (0, 0)
    i32, i64 = np.int32, np.int64
    if p.varlen:
        runtime.get_kernel(prep_spec, qa.device, "kda_chunk_offsets").launch(
            (1, 1, 1), (1024, 1, 1), (cu_ptr, i32(cu_is64), i32(N), i32(T), chunk_off), 0, strm)
    if plan.chunk_slots > 0 and T > 0:
        strides = []
        for a in (qa, ka, ga, ba):
            strides += [a.ptr] + [i64(s) for s in a.strides[:3]]
        runtime.get_kernel(prep_spec, qa.device, "kda_prepare").launch(
            (plan.chunk_slots, H, 1), (PREP_THREADS, 1, 1),
            (*strides, Aa.ptr if Aa is not None else 0, da.ptr if da is not None else 0, cu_ptr, i32(cu_is64),
             i32(N), i32(T), chunk_off, np.float32(p.variant.lower_bound), np.float32(scale), records),
            plan.prep_smem, strm)
    vmap = v_tensor_map(va, plan.v_split, C) if T > 0 else bytes(128)   # never read without chunks
    runtime.get_kernel(rec_spec, qa.device, "kda_recurrence").launch(
        (K // plan.v_split, H, N), ((plan.warps + 1) * 32, 1, 1),
        (vmap, records, chunk_off, cu_ptr, i32(cu_is64), i32(T),
         oa.ptr, i64(oa.strides[0]), i64(oa.strides[1]), i64(oa.strides[2]),
         s0.ptr if s0 is not None else 0, fa.ptr if fa is not None else 0, i32(p.state_dtype == "bfloat16"),
         idx.ptr if pooled else 0, i32(pooled and idx.dtype == "int64"), i32(p.pool_rows),
         hia.ptr if hia is not None else 0),
        plan.rec_smem, strm)
    return to_framework(qa, out), returned
