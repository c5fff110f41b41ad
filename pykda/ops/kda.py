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

from dataclasses import dataclass

import numpy as np

from .. import runtime
from ..runtime.arrays import DeviceArray, as_device_array, empty_like_framework, launch_stream, to_framework
from .checks import (check_aligned, check_contiguous, check_dtype, check_inner_contiguous, check_lower_bound, check_ndim, check_same_device, check_shape, check_stages, resolve_scale)

HEAD_DIMS = (64, 128)
CHUNK_SIZES = (16, 32)
STATE_DTYPES = ("float32", "bfloat16")
CU_DTYPES = ("int32", "int64")
# Most negative lower_bound per chunk size: |G| <= C·|lower_bound|·log2(e) must keep 2^±G inside
# bf16's exponent range (2^127).
LOWER_BOUND_LIMITS = {16: -5.5, 32: -2.7}
PREP_THREADS = 128
MAX_SEQUENCES = 65535          # grid z of kda_recurrence
DEFAULT_STAGES = {16: 4, 32: 3}
SPLIT_S = False                # state split into bf16 hi + lo for S·kdᵀ and S·qdᵀ


def record_bytes(K: int, C: int) -> int:
    """Bytes of one (chunk, head) workspace record (KdaRecord<K, C> in kda_chunk.cuh)."""
    return 3 * C * K * 2 + 2 * C * C * 2 + K * 4


def prepare_smem_bytes(K: int, C: int) -> int:
    """All of kda_prepare's shared memory is dynamic (SMEM_BYTES in the template)."""
    return 3 * C * (K + 8) * 4 + C * (C + 1) * 4 + K * 4 + C * 4 + 2 * C * C * 2


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
                   prep_smem=_above_static_margin(prepare_smem_bytes(K, C)),
                   rec_smem=_above_static_margin(recurrence_smem_bytes(K, C, warps, stages)))


def kda_specs(p: KdaProblem, plan: KdaPlan, arch: str, split_s: bool | None = None) -> tuple[runtime.KernelSpec, ...]:
    split_s = SPLIT_S if split_s is None else split_s
    prep = runtime.KernelSpec.make("kda_prepare", {"K": p.head_dim, "C": p.chunk}, arch,
                                   kernels=("kda_chunk_offsets", "kda_prepare"))
    rec = runtime.KernelSpec.make("kda_recurrence", {"K": p.head_dim, "C": p.chunk, "WARPS": plan.warps,
                                                     "STAGES": plan.stages, "SPLIT_S": bool(split_s)},
                                  arch, kernels=("kda_recurrence",))
    return prep, rec


def check_chunk_lower_bound(lower_bound: float, chunk_size: int) -> float:
    """lower_bound valid (finite, <= 0) and within the chunk size's range."""
    lb = check_lower_bound(lower_bound)
    limit = LOWER_BOUND_LIMITS[chunk_size]
    if lb < limit:
        hint = " (use chunk_size=16)" if chunk_size == 32 and lb >= LOWER_BOUND_LIMITS[16] else ""
        raise ValueError(f"lower_bound {lb} is below {limit}, the limit for chunk_size={chunk_size}: the "
                         f"cumulative decay 2^±G of a chunk would leave bf16's range{hint}")
    return lb


def check_kda_inputs(q: DeviceArray, k: DeviceArray, v: DeviceArray, g: DeviceArray, beta: DeviceArray,
                     A_log: DeviceArray, dt_bias: DeviceArray) -> tuple[int, int, int, int]:
    """Ranks, dtypes and shapes of KDA's per-token inputs and gate parameters, shared by prefill
    and decode; returns (B, T, H, K). Layout and alignment are each op's own."""
    layout = "[B, T, H, K]"
    for name, a in (("q", q), ("k", k), ("g", g)):
        check_ndim(a, name, 4, layout)
    check_ndim(v, "v", 4, "[B, T, H, V]")
    check_ndim(beta, "beta", 3, "[B, T, H]")
    for name, a in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_dtype(a, name, ("bfloat16",))
    B, T, H, K = q.shape
    if K not in HEAD_DIMS:
        raise ValueError(f"head dim K must be one of {HEAD_DIMS}; got {K}")
    for name, a in (("k", k), ("g", g)):
        check_shape(a, name, (B, T, H, K), layout)
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H = {(B, T, H)}; got {tuple(v.shape)}")
    if v.shape[3] != K:
        raise ValueError(f"v's head dim V ({v.shape[3]}) must equal q's head dim K ({K})")
    check_shape(beta, "beta", (B, T, H), "[B, T, H]")
    check_dtype(A_log, "A_log", ("float32",))
    if A_log.ndim != 1 or A_log.shape[0] != H:
        raise ValueError(f"A_log must have shape [H] = ({H},); got {tuple(A_log.shape)}")
    check_contiguous(A_log, "A_log")
    check_dtype(dt_bias, "dt_bias", ("float32",))
    if tuple(dt_bias.shape) not in ((H, K), (H * K,)):
        raise ValueError(f"dt_bias must have shape [H, K] = {(H, K)} or [H*K] = ({H * K},); got {tuple(dt_bias.shape)}")
    check_contiguous(dt_bias, "dt_bias")
    return B, T, H, K


def validate_kda(q: DeviceArray, k: DeviceArray, v: DeviceArray, g: DeviceArray, beta: DeviceArray,
                 A_log: DeviceArray, dt_bias: DeviceArray, initial_state: DeviceArray | None,
                 cu_seqlens: DeviceArray | None, out: DeviceArray | None, final_state: DeviceArray | None,
                 chunk_size: int, lower_bound: float) -> KdaProblem:
    """Check dtypes, ranks, shapes, layouts, alignment and ranges; no GPU needed, no values read."""
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}; got {chunk_size}")
    check_chunk_lower_bound(lower_bound, chunk_size)
    B, T, H, K = check_kda_inputs(q, k, v, g, beta, A_log, dt_bias)
    if H < 1 or H > 65535:
        raise ValueError(f"the number of heads H must be in 1..65535; got {H}")
    for name, a in (("q", q), ("k", k), ("v", v), ("g", g)):
        check_inner_contiguous(a, name)
        check_aligned(a, name, 16)

    check_aligned(dt_bias, "dt_bias", 16)

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
    state_shape, state_layout = (N, H, K, K), "[N, H, V, K]"
    state_dtype = None
    for name, s in (("initial_state", initial_state), ("final_state", final_state)):
        if s is None:
            continue
        check_dtype(s, name, STATE_DTYPES)
        check_shape(s, name, state_shape, state_layout)
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
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log, "dt_bias": dt_bias}
    for name, a in (("initial_state", initial_state), ("cu_seqlens", cu_seqlens), ("out", out),
                    ("final_state", final_state)):
        if a is not None:
            arrays[name] = a
    check_same_device(arrays)
    return KdaProblem(batch=B, seq_len=T, heads=H, head_dim=K, n_seq=N, varlen=cu_seqlens is not None,
                      chunk=chunk_size, state_dtype=state_dtype or "float32")


def v_tensor_map(v: DeviceArray, vs: int, chunk: int) -> np.ndarray:
    """4-D map (V, H, T, B) over v in place, box (VS, 1, C, 1); rows past T read as zeros."""
    B, T, H, V = v.shape
    sb, st, sh = (s * 2 for s in v.strides[:3])
    # size-1 dims: any valid stride will do (never stepped over)
    sh = sh if H > 1 else V * 2
    st = st if T > 1 else max(sh * H, 16)
    sb = sb if B > 1 else max(st * T, 16)
    return runtime.encode_tiled("v", "bfloat16", v.ptr, (V, H, T, B), (sh, st, sb), (vs, 1, chunk, 1))


def chunk_kda(q, k, v, g, beta, *, A_log, dt_bias, lower_bound: float = -5.0, scale: float | None = None,
              initial_state=None, output_final_state: bool = False, cu_seqlens=None, out=None,
              final_state=None, chunk_size: int = 16, stream=None, warps: int | None = None,
              stages: int | None = None):
    """Chunked Kimi Delta Attention forward (prefill), fused: L2 norm of q and k, the gate
    `lower_bound · sigmoid(exp(A_log) · (g + dt_bias))` and `sigmoid(beta)` are in the kernels.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H] (logits); all bf16, read in place
    (last dim contiguous, 16-byte aligned strides). A_log: [H] fp32; dt_bias: [H, K] or [H*K]
    fp32. K = V in {64, 128}. `scale` defaults to K^-0.5.
    States [N, H, V, K], fp32 or bf16: `initial_state` (None: zeros); the final state is returned
    when `output_final_state` or when `final_state` (a buffer to fill, which may be
    `initial_state` itself) is given; it has initial_state's dtype (fp32 when none is given).
    `cu_seqlens` (int32/int64 on the device, [N + 1], B = 1): packed variable-length sequences;
    see the module docstring for its contract. Output rows outside the sequences are never written.
    `chunk_size` 16, or 32 when lower_bound >= -2.7. `warps`, `stages` override the planner.
    Returns (o [B, T, H, V] bf16 in q's framework (or `out`), final_state or None).
    """
    qa, ka, va, ga, ba = (as_device_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")))
    Aa, da = as_device_array(A_log, "A_log"), as_device_array(dt_bias, "dt_bias")
    s0 = as_device_array(initial_state, "initial_state") if initial_state is not None else None
    cua = as_device_array(cu_seqlens, "cu_seqlens") if cu_seqlens is not None else None
    oa = as_device_array(out, "out") if out is not None else None
    fa = as_device_array(final_state, "final_state") if final_state is not None else None
    p = validate_kda(qa, ka, va, ga, ba, Aa, da, s0, cua, oa, fa, chunk_size, lower_bound)
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
    if N == 0:   # an empty batch: nothing to compute
        o = out if out is not None else empty_like_framework(qa, (B, T, H, K), "bfloat16")
        fs = final_state if final_state is not None else (
            empty_like_framework(qa, (0, H, K, K), p.state_dtype) if output_final_state else None)
        return to_framework(qa, o), (to_framework(qa, fs) if fs is not None else None)
    if out is None:
        out = empty_like_framework(qa, (B, T, H, K), "bfloat16")
        oa = as_device_array(out, "out")
    want_final = output_final_state or final_state is not None
    if want_final and final_state is None:
        final_state = empty_like_framework(qa, (N, H, K, K), p.state_dtype)
        fa = as_device_array(final_state, "final_state")

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
            (*strides, Aa.ptr, da.ptr, cu_ptr, i32(cu_is64), i32(N), i32(T), chunk_off,
             np.float32(lower_bound), np.float32(scale), records),
            plan.prep_smem, strm)
    vmap = v_tensor_map(va, plan.v_split, C) if T > 0 else bytes(128)   # never read without chunks
    runtime.get_kernel(rec_spec, qa.device, "kda_recurrence").launch(
        (K // plan.v_split, H, N), ((plan.warps + 1) * 32, 1, 1),
        (vmap, records, chunk_off, cu_ptr, i32(cu_is64), i32(T),
         oa.ptr, i64(oa.strides[0]), i64(oa.strides[1]), i64(oa.strides[2]),
         s0.ptr if s0 is not None else 0, fa.ptr if fa is not None else 0, i32(p.state_dtype == "bfloat16")),
        plan.rec_smem, strm)
    return to_framework(qa, out), (to_framework(qa, final_state) if want_final else None)
