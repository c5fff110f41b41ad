"""Kimi Delta Attention prefill: `chunk_kda` (fla's argument names, FlashKDA's fusions).

validate -> plan (V split, pipeline) -> specs -> kernels -> workspace + tensor map -> launch:

1. `kda_prepare`, grid (chunk slots, H) or heads fastest: token-parallel per (chunk, head) — L2 norm, gate,
   sigmoid(beta), fp32 cumsum, decayed q/k, L and Mqk (mma.sync), (I + L)^-1 — one record per
   (chunk, head) in the workspace.
2. `kda_recurrence`, grid (V / VS · sequences, H): the chunk recurrence with an fp32 state slice
   of VS rows on chip, fed by a TMA/bulk-copy pipeline.

Long sequences, where the chain of chunks would dominate, run in segments of `seg_chunks` chunks
(DESIGN.md, "Segments and ranks"; `plan_segments` decides): `kda_recurrence` pass 1 (MAP) computes
every segment's affine map [B; M] from zero in parallel, `kda_segment_scan` joins them into the
segments' start states (its stages filled by TMA over the maps; for a few long sequences in two
levels, `scan_groups`: groups of maps composed at once, their starts walked, each group walked
from its start), and pass 2 (the kernel of step 2, one CTA per segment) writes the outputs and the
final state.

Every kernel finds its sequence, chunk records and segments from cu_seqlens on the device
(kda_chunk.cuh: sequence n's records start at slot floor(cu[n] / C) + n, no prefix sum needed),
so no host synchronisation happens and a call can be captured in a CUDA graph; the grids are
sized by upper bounds and their spare CTAs exit.

`chunk_kda_slice` runs one rank's slice of longer sequences (context parallelism; the exchange
between ranks is pykda.distributed's): pass 1 maps every segment, the scan joins them into the
slice's map [B; M], a callback turns that into the slice's true start state, and the scan and
pass 2 finish from there.

cu_seqlens contract (its values live on the device and are never read by the host, so they are
not checked — only dtype, rank, contiguity and B = 1 are): non-decreasing values within [0, T].
fla's convention (start at 0, end at T) is the usual case; gaps at either end are allowed and
those output rows are never written. The kernels clamp every sequence into [0, T] with a
non-negative length, so a malformed cu_seqlens (decreasing, out of range) can never make them
access memory out of bounds, but the results for such input are undefined.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import runtime
from ..runtime.arrays import CallArrays, DeviceArray, as_device_array, contiguous_strides
from .bound import bound_launch
from .checks import (Memo, check_aligned, check_contiguous, check_dtype, check_inner_contiguous, check_ndim,
                     check_rows_contiguous, check_same_device, check_shape, check_stages, is_int, prepared_key,
                     resolve_scale)
from .kda_variant import KdaFlags, KdaVariant, resolve_state_v_first, resolve_variant

HEAD_DIMS = (64, 128)
CHUNK_SIZES = (16, 32)
STATE_DTYPES = ("float32", "bfloat16")
CU_DTYPES = ("int32", "int64")
PREP_THREADS = 128
# kda_prepare's growth-factor form takes a chunk whose log2-decay G_C stays >= -GROWTH_LIMIT on
# every key dim (2^-G fits fp32 and bf16); other chunks take the growth-free form
GROWTH_LIMIT = 120.0
DEFAULT_STAGES = {16: 4, 32: 3}
FLA_CHUNKS = (32, 64)          # fla's chunk sizes (64 its default): the spacing of its intermediate states
SEGMENT_MIN_CHUNKS = 64        # the planner's smallest segment: ~30 µs of chain, well above two launches
SPLIT_S = False                # state split into bf16 hi + lo for S·kdᵀ and S·qdᵀ


def record_bytes(K: int, C: int) -> int:
    """Bytes of one (chunk, head) workspace record (KdaRecord<K, C> in kda_chunk.cuh)."""
    return 3 * C * K * 2 + 2 * C * C * 2 + K * 4


def prepare_smem_bytes(K: int, C: int) -> int:
    """All of kda_prepare's shared memory is dynamic (SMEM_BYTES in the template)."""
    return 3 * C * (K + 8) * 4 + C * (C + 1) * 4 + (K + K // 8) * 4 + C * 4 + 2 * C * C * 2


def bounded_gate(p: "KdaProblem") -> bool:
    """The gate cannot take a chunk's log2-decay below -GROWTH_LIMIT: kda_prepare needs only its
    growth-factor form."""
    v = p.variant
    return v.gate == "safe" and v.lower_bound * p.chunk * math.log2(math.e) >= -GROWTH_LIMIT


def _above_static_margin(smem: int) -> int:
    """Dynamic smem just under 48 KB plus a kernel's static smem can exceed the default limit
    without the opt-in the launcher only sets above 48 KB: step over that gap."""
    return 48 * 1024 + 16 if 48 * 1024 - 512 < smem <= 48 * 1024 else smem


def map_bytes(K: int) -> int:
    """Bytes of one (map slot, head) of the segmented recurrence: [B; M] fp32, [2V][K]."""
    return 2 * K * K * 4


def scan_smem_bytes(K: int) -> int:
    """kda_segment_scan's dynamic shared memory: 1 KB to align to 1024 bytes, two stages of M
    [K][K] and 16 B rows (fp32, as TMA writes them), then the state rows as bf16 hi and lo planes,
    [2][2][16][K+8]."""
    return 1024 + 2 * (K + 16) * K * 4 + 2 * 2 * 16 * (K + 8) * 2


def scan_tensor_maps(p: "KdaProblem", slots: int) -> tuple[runtime.TiledMaps, runtime.TiledMaps]:
    """The scan's two tensor maps over the maps region's rows (K fp32 columns, slots · H · 2V
    rows): boxes of 32 columns by K rows (M) and by 16 rows (B), with the 128-byte swizzle."""
    K = p.head_dim
    dims, strides = (K, slots * p.heads * 2 * K), (K * 4,)
    return tuple(runtime.TiledMaps("maps", "float32", dims, strides, (32, rows), swizzle=128) for rows in (K, 16))


def recurrence_smem_bytes(K: int, C: int, warps: int, stages: int) -> int:
    """kda_recurrence's dynamic shared memory: STAGES x [v tile | record], each 1024-byte aligned,
    then the warps' o staging, and 1024 bytes to align the base."""
    up = lambda n: -(-n // 1024) * 1024   # noqa: E731
    return stages * up(up(C * 16 * warps * 2) + record_bytes(K, C)) + warps * C * 16 * 2 + 1024


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
class KdaSegments:
    """The segmented recurrence (kda_chunk.cuh's KdaSegment); chunks = 0: none."""
    chunks: int           # chunks per segment
    split_above: int      # sequences of more chunks split (varlen; 0 with fixed lengths)
    slots: int            # pass 2's segments (an upper bound with varlen)
    map_slots: int        # pass 1's map slots, every segment but each sequence's last (a bound likewise)
    scan_candidates: int  # sequences that may have 3 segments or more (a bound likewise)
    group_slots: int = 0  # the scan in two levels (scan_groups): map slots a group; 0: one walk
    groups: int = 0       # groups a candidate, each with a slot of its own after the map slots

    @property
    def region_slots(self) -> int:
        """Slots of the workspace's maps region: the map slots, then the groups'."""
        return self.map_slots + self.scan_candidates * self.groups


NO_SEGMENTS = KdaSegments(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class KdaPlan:
    warps: int            # consumer warps per recurrence CTA; VS = 16·warps state rows
    stages: int
    chunk_slots: int      # kda_prepare's slots (prepare_grid; an upper bound on the chunk count with varlen)
    prep_smem: int
    rec_smem: int
    segments: KdaSegments = NO_SEGMENTS
    rank: bool = False    # a rank's slice (chunk_kda_slice)
    wgmma: bool = False   # the recurrence's products on wgmma (kda_recurrence's WGMMA)

    @property
    def v_split(self) -> int:
        return 16 * self.warps


def chunk_bound(p: "KdaProblem") -> int:
    """The chunk slots: B·ceil(T / C), or with varlen ceil(T / C) + N (kda_chunk.cuh: sequence n's
    records start at slot floor(cu[n] / C) + n)."""
    cps = -(-p.seq_len // p.chunk)
    return cps + p.n_seq if p.varlen else p.batch * cps


def plan_segments(p: "KdaProblem", sm_count: int, segment_chunks: int | None, longest: int | None = None,
                  rank: bool = False) -> KdaSegments:
    """Segments where the chain of chunks dominates (segment_chunks None), none (0), or of
    `segment_chunks` chunks for every sequence longer than that. A chain dominates when it is
    longer than one SM's share of the call's chunk·heads. With fixed lengths that is the case of
    too few chains (B·H·V/16 warps) for the GPU; each sequence then splits into as many segments
    as one wave of pass 2's CTAs (one per segment and head) holds. With varlen the
    lengths stay on the device (the grids are sized by upper bounds, their spare CTAs exit): the
    sequences longer than a share split into thirds of a share, finely enough for the short ones'
    work to fill in beside them; the others stay whole. `longest` (chunks; from cu_seqlens_cpu,
    rounded up) lets the host skip segments where no sequence is that long. A rank's slice (fixed
    lengths) always has segments, one at least, each with a map slot (kda_recurrence's RANK)."""
    cps = -(-p.seq_len // p.chunk)
    split_above = 0
    if segment_chunks is None:
        if p.varlen:
            share = max(SEGMENT_MIN_CHUNKS, -(-chunk_bound(p) * p.heads // sm_count))
            segment_chunks, split_above = max(SEGMENT_MIN_CHUNKS, share // 3), share
        elif 0 < p.batch * p.heads * p.head_dim // 16 < sm_count:   # as many segments per sequence as fill one wave
            per = max(2, sm_count // (p.batch * p.heads))
            segment_chunks = max(SEGMENT_MIN_CHUNKS, -(-cps // per))
        else:
            segment_chunks = 0
        if min(cps, cps if longest is None else longest) <= max(split_above, 2 * segment_chunks - 1):
            segment_chunks = 0   # no sequence is long enough
    if rank:
        segment_chunks = segment_chunks or max(cps, 1)
        per = max(1, -(-cps // segment_chunks))
        return KdaSegments(segment_chunks, 0, p.batch * per, p.batch * per, p.batch)
    if segment_chunks == 0 or p.n_seq == 0:
        return NO_SEGMENTS
    if p.varlen:   # kda_chunk.cuh: map slots from floor(base(n) / seg), segments from there + n
        maps = -(-chunk_bound(p) // segment_chunks)
        bound = (cps + p.n_seq) // (max(split_above, 2 * segment_chunks) + 1) + 1   # kda_chunk.cuh, kda_scan_candidate
        return KdaSegments(segment_chunks, split_above, maps + p.n_seq, maps, min(bound, p.n_seq))
    per = max(1, -(-cps // segment_chunks))
    group_slots, groups = scan_groups(per - 2, p.batch * p.heads * 2 * p.head_dim // 16, sm_count)
    return KdaSegments(segment_chunks, 0, p.batch * per, p.batch * (per - 1), p.batch, group_slots, groups)


# the two-level scan's two extra launches, in scan steps (a step: ~1.6 µs on the H200)
SCAN_LAUNCH_STEPS = 2


def scan_groups(steps: int, group_ctas: int, sm_count: int) -> tuple[int, int]:
    """The scan in two levels for sequences of `steps` dependent steps (fixed lengths), as
    (group_slots, groups), or (0, 0) where one walk is as short: every group of g slots composed
    at once (g − 1 steps; `group_ctas` CTAs a group across the batch and heads, as many groups as
    one wave holds), the groups' starts walked (groups − 1), then every group from its start (g):
    2g + groups − 2 steps and two more launches."""
    best = (steps, 0, 0)
    for n in range(2, min(sm_count // max(group_ctas, 1), math.isqrt(2 * max(steps, 0))) + 1):
        g = -(-steps // n)
        groups = -(-steps // g)
        cost = 2 * g + groups - 2 + 2 * SCAN_LAUNCH_STEPS
        if cost < best[0]:
            best = (cost, g, groups)
    return best[1], best[2]


# the recurrence at half the warps (twice the CTAs, each K-side record read by twice as many) and the
# same wave balance: 0.84 of the speed (H200, H=64 T=8192: 2 warps 0.707 ms, 4 warps 0.594 ms)
HALVED_WARPS_SPEED = 0.84


# chains of 8 warps on wgmma (one CTA a chain, one an SM) walk their chunks fast enough to beat a
# V split over more CTAs once they cover this share of the SMs (H200, softplus gate: H=96 T=8192
# 0.834 ms against 0.870 at 2 warps; 2 x 96 chains of 4096 0.855 against 0.956 at 4; but 64 chains
# of 8192 at H=64 0.680 against 0.579 at 4 warps)
WGMMA_CHAINS_SHARE = 0.7


def wave_balance(ctas: int, sm_count: int) -> float:
    """How full the SMs' last round is: `ctas` spread over `sm_count` SMs, each running
    ceil(ctas / sm_count) at most (1.0: every SM the same number)."""
    return ctas / (sm_count * -(-ctas // sm_count))


def plan_kda(p: KdaProblem, sm_count: int, warps: int | None = None, stages: int | None = None,
             segment_chunks: int | None = None, longest: int | None = None, rank: bool = False) -> KdaPlan:
    """Segments (plan_segments); then split V across CTAs until sequences (or segments) x heads x
    splits covers ~all SMs (90%; 16 rows minimum), and once more where chains of one length
    would leave the SMs' last round unevenly full (H=96: 192 CTAs on 132 SMs, 60 of them with
    two) and twice the CTAs even it out enough to pay for the halved warps (not to one warp, nor
    with segments, which size their own wave: unmeasured). Where wgmma takes the shapes, chains of
    8 warps on it (no split) win over both once they cover WGMMA_CHAINS_SHARE of the SMs."""
    K, C = p.head_dim, p.chunk
    wgmma_shapes = K == 128 and C == 16 and not SPLIT_S
    if segment_chunks is not None:
        if not is_int(segment_chunks) or segment_chunks < 0:
            raise ValueError(f"segment_chunks must be a non-negative int (0: no segments); got {segment_chunks!r}")
        segment_chunks = int(segment_chunks)
    segments = plan_segments(p, sm_count, segment_chunks, longest, rank)
    if warps is None:
        options = [w for w in (8, 4, 2, 1) if 16 * w <= K]
        chains = segments.slots if segments.chunks else p.n_seq
        ctas = lambda w: chains * p.heads * (K // (16 * w))   # noqa: E731
        i = next((i for i, w in enumerate(options) if ctas(w) >= 0.9 * sm_count), len(options) - 1)
        warps = options[i]
        if wgmma_shapes and not segments.chunks and ctas(8) >= WGMMA_CHAINS_SHARE * sm_count:
            warps = 8   # two warpgroups a chain on wgmma
        elif not p.varlen and not segments.chunks and i + 1 < len(options) and options[i + 1] >= 2 and \
                HALVED_WARPS_SPEED * wave_balance(ctas(options[i + 1]), sm_count) > wave_balance(ctas(warps), sm_count):
            warps = options[i + 1]   # chains of one length: twice the CTAs spread evenly enough to pay
    if not is_int(warps) or warps not in (1, 2, 4, 8) or 16 * warps > K:
        raise ValueError(f"warps must be 1, 2, 4 or 8 with 16·warps <= {K}; got {warps!r}")
    stages = stages or DEFAULT_STAGES[C]
    # wgmma, at its shapes, for the segment passes (several CTAs an SM: its throughput pays) and for
    # two warpgroups a CTA (8 warps: its fewer instructions pay); one warpgroup walking a chain is
    # faster on mma.sync (docs/PERFLOG.md, sessions 20 and 21)
    wgmma = (bool(segments.chunks) or warps == 8) and warps % 4 == 0 and wgmma_shapes
    return KdaPlan(warps=warps, stages=stages, chunk_slots=chunk_bound(p),
                   prep_smem=_above_static_margin(prepare_smem_bytes(K, C)),
                   rec_smem=_above_static_margin(recurrence_smem_bytes(K, C, warps, stages)), segments=segments,
                   rank=rank, wgmma=wgmma)


def kda_specs(p: KdaProblem, plan: KdaPlan, arch: str, split_s: bool | None = None,
              checkpoints: bool = False) -> tuple[runtime.KernelSpec, ...]:
    """(prepare, recurrence (writing checkpoints if asked)), then with segments (pass 1, scan of
    the starts, or its three walks in two levels), and for a rank's slice (pass 1, scan of the
    slice's map, scan of the starts)."""
    split_s = SPLIT_S if split_s is None else split_s
    prep = runtime.KernelSpec.make("kda_prepare", {"K": p.head_dim, "C": p.chunk, "GROWTH_LIMIT": GROWTH_LIMIT,
                                                   "BOUNDED": bounded_gate(p), "HEADS_FASTEST": heads_fastest(p),
                                                   **p.variant.template_params()},
                                   arch, kernels=("kda_prepare",))

    def recurrence(map_pass: bool) -> runtime.KernelSpec:
        ckpt = checkpoints and not map_pass
        return runtime.KernelSpec.make("kda_recurrence", {"K": p.head_dim, "C": p.chunk, "WARPS": plan.warps,
                                                          "STAGES": plan.stages, "SPLIT_S": bool(split_s),
                                                          "VFIRST": p.v_first, "MAP": map_pass, "RANK": plan.rank,
                                                          "CKPT": ckpt, "WGMMA": plan.wgmma and not ckpt and not split_s},
                                       arch, kernels=("kda_recurrence",))

    def scan(mode: str) -> runtime.KernelSpec:
        return runtime.KernelSpec.make("kda_scan", {"K": p.head_dim, "C": p.chunk, "MODE": mode}, arch,
                                       kernels=("kda_segment_scan",))
    if plan.rank:
        return prep, recurrence(False), recurrence(True), scan("rank_total"), scan("rank_starts")
    if not plan.segments.chunks:
        return prep, recurrence(False)
    if plan.segments.groups:
        return prep, recurrence(False), recurrence(True), scan("group_total"), scan("group_starts"), scan("group_walk")
    return prep, recurrence(False), recurrence(True), scan("starts")


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
    check_shape(k, "k", (B, T, H, K), layout)
    if tuple(v.shape[:2]) == (B, T) and v.shape[2] != H:   # (before g and beta, which have v's heads there)
        raise ValueError(f"v has {v.shape[2]} heads and q {H}: grouped value heads (HV > H) are not supported")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H = {(B, T, H)}; got {tuple(v.shape)}")
    if v.shape[3] != K:
        raise ValueError(f"v's head dim V ({v.shape[3]}) must equal q's head dim K ({K})")
    check_shape(g, "g", (B, T, H, K), layout)
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
    else:
        N = B
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
        if state_indices is not None:   # a pool: its rows may be a view's, any distance apart
            check_rows_contiguous(s, name)
        else:
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


def v_tensor_maps(v: DeviceArray, vs: int, chunk: int) -> runtime.TiledMaps:
    """4-D maps (V, H, T, B) over arrays laid out as v, box (VS, 1, C, 1); rows past T read as zeros."""
    B, T, H, V = v.shape
    sb, st, sh = (s * 2 for s in v.strides[:3])
    # size-1 dims: any valid stride will do (never stepped over)
    sh = sh if H > 1 else V * 2
    st = st if T > 1 else max(sh * H, 16)
    sb = sb if B > 1 else max(st * T, 16)
    return runtime.TiledMaps("v", "bfloat16", (V, H, T, B), (sh, st, sb), (vs, 1, chunk, 1))


# the kernels' parameters, in order, as `runtime.signature` gives them (pointers as int)
I32, I64, F32 = np.int32, np.int64, np.float32
PREPARE_SIGNATURE = (int, I64, I64, I64) * 4 + (int, int, int, I32, I32, I32, F32, F32, int)
RECURRENCE_SIGNATURE = (128, int, int, I32, I32, I32, int, I64, I64, I64, int, int, I32, int, I32, I32, I64, int,
                        I32, I32, int, int, I32, I64, I32)
SCAN_SIGNATURE = (128, 128, int, I32, I32, int, I32, I32, I32, I32, I32, I64, int)
# what a call gives its launches anew (runtime.CallValues), in this order; all else is the prepared call's
CALL_VALUES = ("v_map", "q", "k", "g", "beta", "A_log", "dt_bias", "initial_state", "state_indices",
               "has_initial_state", "cu_seqlens", "out", "final_state", "checkpoints", "checkpoint_rows", "records",
               "maps", "m_tmap", "b_tmap", "total", "start")
CALL_SIGNATURE = (128,) + (int,) * 13 + (I64,) + (int,) * 2 + (128, 128) + (int,) * 2
PER_CALL = {name: runtime.PerCall(i) for i, name in enumerate(CALL_VALUES)}


# kda_prepare's CTAs in heads-fastest order up to this many heads (H200, prepare µs, chunks fastest ->
# heads fastest, softplus / safe gate: H=4 T=262144 593 -> 583 / -, H=8 T=131072 594 -> 582 / 578 -> 568,
# H=16 T=65536 600 -> 583 / -, varlen H=8 995 -> 977 / -; but H=64 T=8192 301 -> 300 / 289 -> 300 and
# H=96 452 -> 447 / 432 -> 453)
HEADS_FASTEST_MAX = 16


def heads_fastest(p: "KdaProblem") -> bool:
    """Whether kda_prepare's CTAs go heads fastest (few heads: the CTAs in flight read whole token
    rows of q, k and g) or chunks fastest (many heads)."""
    return p.heads <= HEADS_FASTEST_MAX


def prepare_grid(heads: int, slots: int, by_heads: bool) -> tuple[int, int, int]:
    """kda_prepare's grid: chunks fastest (slots, H, 1); or heads fastest (H, slots, 1), past grid
    y's 65535 the slots as y + z·y_dim, (H, ceil(slots / z), z) (the few CTAs past the last slot exit)."""
    if not by_heads:
        return slots, heads, 1
    z = -(-slots // 65535)
    return heads, -(-slots // z), z


def _slot_major(rows: int, heads: int, slots: int) -> tuple[int, int, int]:
    """kda_recurrence's grid: (rows, H, slots), slots outermost (CTAs in flight share chunks across
    heads); (rows · slots, H, 1) where slots exceed grid z's 65535."""
    return (rows, heads, slots) if slots <= 65535 else (rows * slots, heads, 1)


class KdaCall(NamedTuple):
    """What a call's launches need besides the values of CALL_VALUES."""
    problem: KdaProblem
    plan: KdaPlan
    values: runtime.CallValues       # the buffer of CALL_VALUES the launches read
    launches: tuple                  # prepare (with chunks), pass 1, the scans (segments; a rank's slice: the
                                     # scan of its map, then of the starts), the recurrence
    v_maps: runtime.TiledMaps | None   # None without tokens or sequences (the map is then never read)
    scan_maps: tuple | None          # the scan's tensor maps over the maps region (scan_tensor_maps); None: no scan
    pooled: bool                     # the final states go back into the pool (initial_state)
    new_final: bool                  # a final-state array is made by the call
    returns_final: bool              # the call returns the final state (or the pool)
    workspace: tuple                 # bytes, and where the maps start (after the records; None: no maps)
    checkpoints: tuple               # (chunks between checkpoints, rows of the given buffer); (0, 0): none


def _workspace_layout(p: KdaProblem, plan: KdaPlan) -> tuple[int, int]:
    """(bytes, maps at): the (chunk slot, head) records, then the (map slot, head) maps, 256-byte aligned."""
    maps_at = -(-plan.chunk_slots * p.heads * record_bytes(p.head_dim, p.chunk) // 256) * 256
    return max(maps_at + plan.segments.region_slots * p.heads * map_bytes(p.head_dim), 16), maps_at


def checkpoint_rows(p: KdaProblem, every: int, cu_seqlens_cpu=None) -> int:
    """Rows of the checkpoints of a call, every `every` tokens: B·ceil(T / every), or with varlen
    Σ ceil(len_n / every) from a host copy of cu_seqlens (clamped as the kernels clamp)."""
    if not p.varlen:
        return p.batch * -(-p.seq_len // every)
    cu = np.clip(np.asarray(cu_seqlens_cpu, dtype=np.int64), 0, p.seq_len)
    lens = np.maximum(cu[1:] - cu[:-1], 0)
    return int((-(-lens // every)).sum())


def check_checkpoints(buf: DeviceArray | None, p: KdaProblem, every: int) -> int:
    """The checkpoint buffer against the call: [B, ceil(T / every), H, ., .] (varlen: [1, rows, H,
    ., .], any rows), bf16 (fla's) or fp32 whatever the states' dtype, contiguous. Returns its rows
    (0 without a buffer)."""
    if every <= 0 or every % p.chunk:
        raise ValueError(f"checkpoint_every must be a positive multiple of chunk_size ({p.chunk}); got {every}")
    if buf is None:
        return 0
    layout = "[N, rows, H, V, K]" if p.v_first else "[N, rows, H, K, V]"
    check_ndim(buf, "intermediate_states", 5, layout)
    check_dtype(buf, "intermediate_states", ("bfloat16", "float32"))
    K, H = p.head_dim, p.heads
    rows = buf.shape[1] if p.varlen else -(-p.seq_len // every)
    check_shape(buf, "intermediate_states", (1 if p.varlen else p.batch, rows, H, K, K), layout)
    check_contiguous(buf, "intermediate_states")
    return buf.shape[0] * buf.shape[1]


def prepare_chunk_kda(q, k, v, g, beta, A_log, dt_bias, initial_state, state_indices, has_initial_state, cu_seqlens,
                      out, final_state, intermediate_states, scale, flags, state_v_first, chunk_size, warps, stages,
                      segment_chunks, longest, output_final_state, wants_checkpoints=False, checkpoint_every=None,
                      rank=False) -> KdaCall:
    """Validate a call, plan it and make everything its launches need but the call's values
    (CALL_VALUES: pointers, v's tensor map, the workspace) and the stream: kernels (compiled on
    first use) bound to their constant arguments. `flags`: KdaFlags or a tuple of its
    fields (the hot path's key holds a plain tuple). `chunk_size`, `checkpoint_every`: as the
    caller gave them (`kernel_chunk`, `checkpoint_tokens`); `wants_checkpoints`: the call writes them.
    `rank`: a rank's slice (chunk_kda_slice)."""
    chunk_size, checkpoint_every = checkpoint_tokens(chunk_size, wants_checkpoints, checkpoint_every)
    p = validate_kda(q, k, v, g, beta, A_log, dt_bias, initial_state, state_indices, has_initial_state, cu_seqlens,
                     out, final_state, KdaFlags(*flags), bool(state_v_first), chunk_size)
    checkpoints, ckpt_bf16 = (I32(0), I64(0)), I32(0)
    if checkpoint_every:
        checkpoints = (I32(checkpoint_every // p.chunk), I64(check_checkpoints(intermediate_states, p,
                                                                               checkpoint_every)))
        ckpt_bf16 = I32(intermediate_states is None or intermediate_states.dtype == "bfloat16")   # new ones: bf16
    if rank and (p.varlen or initial_state is not None):
        raise ValueError("a rank's slice takes fixed-length sequences (no cu_seqlens) and its start state from "
                         "start_of (no initial_state)")
    scale = resolve_scale(scale, p.head_dim)
    check_stages(stages)
    runtime.require_gpu()
    dev = runtime.device_info(q.device)
    plan = plan_kda(p, dev.sm_count, warps, stages, segment_chunks, longest, rank)
    smem = max(plan.rec_smem, plan.prep_smem, scan_smem_bytes(p.head_dim) if plan.segments.chunks else 0)
    if smem > dev.smem_per_block_optin:
        raise ValueError(f"the plan needs {smem} bytes of shared memory per block; the device allows "
                         f"{dev.smem_per_block_optin} (use fewer stages)")
    specs = kda_specs(p, plan, dev.arch, checkpoints=bool(checkpoint_every))
    runtime.load_specs(specs, q.device)   # up to six kernels: compiled at once on first use
    B, T, H, K, N, C = p.batch, p.seq_len, p.heads, p.head_dim, p.n_seq, p.chunk
    seg = plan.segments
    rec_threads = (plan.warps + 1) * 32
    rows = K // plan.v_split
    pooled = state_indices is not None
    at = PER_CALL   # at["q"]: the argument the launch reads from the call's value "q"
    in_strides = tuple(tuple(map(I64, a.strides[:3])) for a in (q, k, g, beta))
    o_strides = tuple(map(I64, (out.strides if out is not None else contiguous_strides((B, T, H, K)))[:3]))
    cu_is64, N32, T32 = I32(cu_seqlens is not None and cu_seqlens.dtype == "int64"), I32(N), I32(T)
    seg_chunks, split_above = I32(seg.chunks), I32(seg.split_above)
    prepare_args = (at["q"], *in_strides[0], at["k"], *in_strides[1], at["g"], *in_strides[2], at["beta"],
                    *in_strides[3], at["A_log"], at["dt_bias"], at["cu_seqlens"], cu_is64, N32, T32,
                    F32(p.variant.lower_bound), F32(scale), at["records"])
    recurrence_args = (at["v_map"], at["records"], at["cu_seqlens"], cu_is64, T32, N32, at["out"], *o_strides,
                       at["initial_state"], at["final_state"], I32(p.state_dtype == "bfloat16"), at["state_indices"],
                       I32(pooled and state_indices.dtype == "int64"), I32(p.pool_rows),
                       I64(initial_state.strides[0] if pooled else H * K * K), at["has_initial_state"], seg_chunks,
                       split_above, at["maps"], at["checkpoints"], checkpoints[0], at["checkpoint_rows"], ckpt_bf16)
    scan_args = (at["m_tmap"], at["b_tmap"], at["maps"], seg_chunks, split_above, at["cu_seqlens"], cu_is64, T32, N32)
    values = runtime.CallValues(CALL_SIGNATURE)
    bound = functools.partial(bound_launch, device=q.device, values=values)
    launches, scan_maps = [], None
    if plan.chunk_slots > 0 and T > 0:
        launches.append(bound(specs[0], name="kda_prepare", sig=PREPARE_SIGNATURE, args=prepare_args,
                              grid=prepare_grid(H, plan.chunk_slots, heads_fastest(p)), threads=PREP_THREADS,
                              smem=plan.prep_smem))
    if seg.chunks and seg.map_slots:   # segments: pass 1, then the scans
        launches.append(bound(specs[2], name="kda_recurrence", sig=RECURRENCE_SIGNATURE, args=recurrence_args,
                              grid=_slot_major(2 * rows, H, seg.map_slots), threads=rec_threads, smem=plan.rec_smem))
        groups = (I32(seg.group_slots), I32(seg.groups), I64(seg.map_slots))
        scan_maps = scan_tensor_maps(p, seg.region_slots)

        def scan(spec, rows, z, rank_rows):   # rows per (candidate, head), z: groups or 1
            return bound(spec, name="kda_segment_scan", sig=SCAN_SIGNATURE, args=scan_args + groups + (rank_rows,),
                         grid=(rows // 16 * seg.scan_candidates, H, z), threads=2 * K, smem=scan_smem_bytes(K))
        if rank:   # the slice's map ([B; M] rows), then the starts
            launches += [scan(specs[3], 2 * K, 1, at["total"]), scan(specs[4], K, 1, at["start"])]
        elif seg.groups:   # the groups' maps ([B; M] rows), their starts, every group's walk
            launches += [scan(specs[3], 2 * K, seg.groups, 0), scan(specs[4], K, 1, 0), scan(specs[5], K, seg.groups, 0)]
        else:
            launches.append(scan(specs[3], K, 1, 0))
    slots = seg.slots if seg.chunks else N
    launches.append(bound(specs[1], name="kda_recurrence", sig=RECURRENCE_SIGNATURE, args=recurrence_args,
                          grid=_slot_major(rows, H, slots), threads=rec_threads, smem=plan.rec_smem))
    v_maps = None
    if T > 0 and N > 0:   # (an empty batch launches nothing)
        v_maps = v_tensor_maps(v, plan.v_split, C)
        v_maps(v.ptr)   # the geometry checked (TensorMapError names v) before any launch
    want_final = bool(output_final_state) or final_state is not None or pooled
    nbytes, maps_at = _workspace_layout(p, plan)
    return KdaCall(p, plan, values, tuple(launches), v_maps, scan_maps, pooled,
                   want_final and final_state is None and not pooled, want_final and (output_final_state or not pooled),
                   (nbytes, maps_at if seg.chunks else None), checkpoints)


def longest_chunks(cu_seqlens_cpu, chunk_size: int) -> int:
    """The longest sequence of a host copy of cu_seqlens, in chunks rounded up to 3 significant
    bits (at most 1/4 more: a prepared call then serves many batches)."""
    try:
        cu = np.asarray(cu_seqlens_cpu)
    except Exception as exc:   # a GPU tensor, say
        raise TypeError(f"cu_seqlens_cpu must be a host array (a list, NumPy or a CPU tensor); got "
                        f"{type(cu_seqlens_cpu).__name__}: {exc}") from exc
    if cu.ndim != 1 or cu.shape[0] < 2 or cu.dtype.kind not in "iu":
        raise ValueError(f"cu_seqlens_cpu must be 1-D integers [N + 1]; got shape {cu.shape}, dtype {cu.dtype}")
    chunks = -(-max(int((cu[1:] - cu[:-1]).max()), 0) // chunk_size)
    step = 1 << max(chunks.bit_length() - 3, 0)
    return -(-chunks // step) * step


def host_entries(x) -> int | None:
    """len(x) of a host sequence (its shape's first size where it has one: torch's len() is a
    Python function, ~0.5 µs a call); None for a 0-d array or an object without a length."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return shape[0] if len(shape) else None
    return len(x) if hasattr(x, "__len__") else None


def kernel_chunk(chunk_size) -> tuple[int, int]:
    """The kernels' chunk for a call's `chunk_size` (pykda's 16 or 32, or fla's 32 or 64: fla's
    64 runs chunks of 16) and the spacing of its checkpoints by default: fla's chunk (32 for 32,
    else 64 tokens)."""
    if not is_int(chunk_size) or chunk_size not in CHUNK_SIZES + FLA_CHUNKS:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES} (the kernels' chunk) or fla's {FLA_CHUNKS}; "
                         f"got {chunk_size!r}")
    return (chunk_size if chunk_size in CHUNK_SIZES else CHUNK_SIZES[0],
            chunk_size if chunk_size in FLA_CHUNKS else FLA_CHUNKS[-1])


def checkpoint_tokens(chunk_size, wants_checkpoints: bool, checkpoint_every) -> tuple[int, int]:
    """The kernels' chunk (`kernel_chunk`) and the tokens between checkpoints: 0 without
    `wants_checkpoints`, else `checkpoint_every` (None: fla's spacing for `chunk_size`), a positive int."""
    chunk, default_every = kernel_chunk(chunk_size)
    if not wants_checkpoints:
        if checkpoint_every is not None:
            raise ValueError("checkpoint_every is given without return_intermediate_states or intermediate_states")
        return chunk, 0
    every = default_every if checkpoint_every is None else checkpoint_every
    if not is_int(every):
        raise ValueError(f"checkpoint_every must be an int (tokens); got {checkpoint_every!r}")
    if every <= 0:
        raise ValueError(f"checkpoint_every must be a positive multiple of chunk_size; got {every}")
    return chunk, int(every)


ARGUMENTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "state_indices", "has_initial_state",
             "cu_seqlens", "out", "final_state", "intermediate_states")
REQUIRED = 5   # q .. beta
# prepared calls by the arguments' key (CallArrays) and the settings: a repeated call is one key compare
PREPARED = Memo(lambda arrays, settings: prepare_chunk_kda(*arrays.views(), *settings))


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: float | None = None, disable_recompute: bool = False,
              return_intermediate_states: bool = False, state_v_first: bool = False, cu_seqlens=None,
              cu_seqlens_cpu=None, cp_context=None, use_graph: bool = False, max_num_seqs: int | None = None, *,
              A_log=None, dt_bias=None, state_indices=None, has_initial_state=None, out=None, final_state=None,
              chunk_size: int = 16, stream=None, warps: int | None = None, stages: int | None = None,
              segment_chunks: int | None = None, checkpoint_every: int | None = None, intermediate_states=None,
              transpose_state_layout: bool | None = None):
    """Chunked Kimi Delta Attention forward (prefill), with fla's `chunk_kda` arguments (in fla's
    positional order; pykda's own are keyword-only).

    q, k: [B, T, H, K] bf16; v: [B, T, H, V] bf16; g: [B, T, H, K] bf16 or fp32; beta: [B, T, H]
    bf16 or fp32; read in place (q, k, v, g: last dim contiguous, 16-byte aligned strides).
    K = V in {64, 128}; `scale` defaults to K^-0.5.
    - `use_qk_l2norm_in_kernel`: L2-normalise q and k in the kernel.
    - Gate (kda_variant.py): `use_gate_in_kernel=False` takes g as the log-decay; `True` computes
      Kimi Linear's `-exp(A_log) * softplus(g + dt_bias)` (unbounded: any decay, 0 included), or
      with `lower_bound` (and `safe_gate`) `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`.
      A_log: H fp32 elements in any shape ([H], [1, 1, H, 1]); dt_bias: H*K fp32 ([H, K], [H*K]).
    - β: probabilities, or logits with `use_beta_sigmoid_in_kernel` (2·sigmoid with `allow_neg_eigval`).
    - States: [N, H, K, V] (fla's layout) or [N, H, V, K] with `state_v_first=True` (fla's
      deprecated name `transpose_state_layout` is taken too), fp32 or bf16.
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
      written. `use_graph`, `max_num_seqs` and `disable_recompute` are accepted for fla's callers
      and change nothing: the values of cu_seqlens are never read by the host, so every call can
      be captured in a CUDA graph.
    - Long sequences run in segments where the chain of chunks would dominate (`plan_segments`);
      `segment_chunks` overrides it: 0 for none, else chunks per segment. With varlen the planner
      cannot see the lengths on the device and may launch segment passes that find nothing to
      split (tens of µs at 64 heads); `cu_seqlens_cpu` (a host copy, as fla takes it) lets it know
      the longest sequence. A CUDA graph keeps the plan of its capture (any lengths stay correct).
    - Checkpoints (prefix caching, speculative-decode rollback), as fla's
      `return_intermediate_states`: the state before tokens 0, E, 2E, ... of each sequence (E =
      `checkpoint_every`, a multiple of the kernel's chunk, default fla's chunk: 32 with
      `chunk_size=32`, else 64), in the states' layout: [B, ceil(T / E), H, ., .], or
      with varlen [1, Σ ceil(len_n / E), H, ., .] in sequence order (fla's packing). With
      `return_intermediate_states` the call returns them as a third value, in
      `intermediate_states` (a buffer to fill, bf16 or fp32; varlen: rows past its end are not
      written) or a new bf16 array, as fla's (varlen: sized from `cu_seqlens_cpu`, which is then
      required).
    - `chunk_size`: the kernels' chunk, 16 or 32; fla's 64 (its default) runs chunks of 16, and
      its checkpoints come every 64 tokens as fla's do. `warps`, `stages` override the planner.
    Returns (o [B, T, H, V] bf16 in q's framework (or `out`), final_state or None[, checkpoints]).
    """
    if cp_context is not None:
        raise ValueError("cp_context (fla's context parallelism) is not supported by chunk_kda")
    del disable_recompute, use_graph, max_num_seqs   # nothing to do with them (see above)
    if cu_seqlens_cpu is not None:
        if cu_seqlens is None:
            raise ValueError("cu_seqlens_cpu is given without cu_seqlens")
        shape = getattr(cu_seqlens, "shape", None)   # (validation names a bad cu_seqlens later)
        entries = host_entries(cu_seqlens_cpu)
        if shape and entries is not None and entries != shape[0]:
            raise ValueError(f"cu_seqlens_cpu must be the host copy of cu_seqlens ({shape[0]} entries); got "
                             f"{entries} entries")
    if transpose_state_layout is not None:
        state_v_first = resolve_state_v_first(state_v_first, transpose_state_layout)
    longest = None   # a planning hint, read only where segments are possible (2 segments of the smallest size)
    if cu_seqlens_cpu is not None and segment_chunks is None:
        shape = getattr(q, "shape", ())   # (validation names a bad q later)
        chunk = kernel_chunk(chunk_size)[0]
        if len(shape) == 4 and shape[1] >= 2 * SEGMENT_MIN_CHUNKS * chunk:
            longest = longest_chunks(cu_seqlens_cpu, chunk)
    arrays = CallArrays((q, k, v, g, beta, A_log, dt_bias, initial_state, state_indices, has_initial_state,
                         cu_seqlens, out, final_state, intermediate_states), ARGUMENTS, REQUIRED)
    # as given: chunk_size and the checkpoints are resolved (and checked) when the call is prepared
    settings = (scale, (use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        safe_gate, lower_bound),   # KdaFlags' fields
                state_v_first, chunk_size, warps, stages, segment_chunks, longest, output_final_state,
                bool(return_intermediate_states) or intermediate_states is not None, checkpoint_every)
    numbers = (chunk_size, warps, stages, segment_chunks, checkpoint_every)
    call = PREPARED.get(prepared_key(arrays.key, settings, numbers), arrays, settings)
    o, fs, ckpt = _run(call, arrays, q, stream, out, initial_state, final_state,
                       checkpoints=(intermediate_states, cu_seqlens_cpu))
    return (o, fs, ckpt) if return_intermediate_states else (o, fs)


def _run(call: KdaCall, arrays: CallArrays, q, stream, out, initial_state, final_state, start_of=None,
         checkpoints=(None, None)):
    """The launches of a prepared call: prepare, then (segments) pass 1 and the scans, then the
    recurrence. A rank's slice asks `start_of` for its start state before its last two launches.
    `checkpoints`: the caller's buffer (or None: a new one) and cu_seqlens_cpu. Returns (out,
    final state or None, checkpoints or None)."""
    p = call.problem
    q_p, k_p, v_p, g_p, b_p, a_p, dt_p, s0_p, idx_p, hi_p, cu_p, o_p, fs_p, ck_p = arrays.ptrs   # 0 for None
    every, ck_rows = call.checkpoints
    ckpt = checkpoints[0]
    if every and ckpt is None:   # (before any allocation or launch: a missing cu_seqlens_cpu is named)
        if p.varlen and checkpoints[1] is None:
            raise ValueError("return_intermediate_states with cu_seqlens needs cu_seqlens_cpu (the number of "
                             "checkpoints depends on the lengths) or an intermediate_states buffer")
        rows = checkpoint_rows(p, every * p.chunk, checkpoints[1])
        shape = (1, rows) if p.varlen else (p.batch, rows // max(p.batch, 1))
        ckpt, ck_p = arrays.new_empty(0, (*shape, p.heads, p.head_dim, p.head_dim), "bfloat16")   # fla's
        ck_rows = I64(rows)
    if out is None:
        out, o_p = arrays.new_contiguous_like(0)   # [B, T, H, V] bf16: q's shape (V = K) and dtype
    if call.pooled:
        final_state, fs_p = initial_state, s0_p
    elif call.new_final:
        final_state, fs_p = arrays.new_empty(0, (p.n_seq, p.heads, p.head_dim, p.head_dim), p.state_dtype)
    # returned: the pool only when asked for; a final_state buffer the caller gave, always
    returned = arrays.result(final_state) if call.returns_final else None
    ckpt = arrays.result(ckpt) if every else None
    if p.n_seq == 0:   # an empty batch: nothing to compute
        return arrays.result(out), returned, ckpt

    strm = arrays.stream(stream)
    nbytes, maps_at = call.workspace
    ws_owner, records = runtime.workspace(q, strm, nbytes)   # held to the last launch
    maps = 0 if maps_at is None else records + maps_at
    scan_tmaps = tuple(m(maps) for m in call.scan_maps) if call.scan_maps else (bytes(128),) * 2
    values = (call.v_maps(v_p) if call.v_maps else bytes(128), q_p, k_p, g_p, b_p, a_p, dt_p, s0_p, idx_p, hi_p,
              cu_p, o_p, fs_p, ck_p, ck_rows, records, maps, *scan_tmaps)   # CALL_VALUES
    if not call.plan.rank:
        call.values.launch(values + (0, 0), call.launches, strm)
    else:   # a rank's slice: up to the scan of its map, its start state from the caller, the last two launches
        total, total_p = arrays.new_empty(0, (p.n_seq, p.heads, 2 * p.head_dim, p.head_dim), "float32")
        call.values.launch(values + (total_p, 0), call.launches[:-2], strm)
        start = start_of(arrays.result(total))   # held to the last launch
        start_p = _start_pointer(start, p, arrays.views()[0].device)
        call.values.launch(values + (total_p, start_p), call.launches[-2:], strm)
    return arrays.result(out), returned, ckpt


def _start_pointer(start, p: KdaProblem, device: int) -> int:
    """The device pointer of a slice's start state, as start_of must return it."""
    name = "start_of's result"
    s = as_device_array(start, name)
    check_dtype(s, name, ("float32",))
    check_shape(s, name, (p.n_seq, p.heads, p.head_dim, p.head_dim), "[B, H, V, K]")
    check_contiguous(s, name)
    if s.device != device:
        raise ValueError(f"{name} must be on q's device ({device}); got device {s.device}")
    return s.ptr


def chunk_kda_slice(q, k, v, g, beta, start_of, scale: float | None = None, output_final_state: bool = False,
                    use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                    use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
                    lower_bound: float | None = None, state_v_first: bool = False, *, A_log=None, dt_bias=None,
                    out=None, final_state=None, chunk_size: int = 16, stream=None, warps: int | None = None,
                    stages: int | None = None, segment_chunks: int | None = None):
    """One rank's slice of B longer sequences (context parallelism), with chunk_kda's arguments
    (no cu_seqlens, initial_state or pool: the slice's start state comes from `start_of`).

    The tokens [B, T, H, .] are a contiguous slice of each sequence. Once the slice's map is known
    (it does not depend on the start state), `start_of(total)` is called with it: total [B, H, 2V, K]
    fp32 in q's framework, rows [0, V) the state the slice reaches from zero (B) and rows [V, 2V)
    its transition (M), so that the slice ends in S·M + B from a start S ([V, K] rows). It must
    return the slice's true start state, [B, H, V, K] fp32 contiguous on q's device (V-first,
    whatever `state_v_first` says of final_state), ready in stream order. Then the slice runs
    from it: returns (o, final_state or None) as chunk_kda does.
    """
    arrays = CallArrays((q, k, v, g, beta, A_log, dt_bias, None, None, None, None, out, final_state, None), ARGUMENTS,
                        REQUIRED)
    settings = (scale, (use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                        safe_gate, lower_bound),
                state_v_first, chunk_size, warps, stages, segment_chunks, None, output_final_state, False, None, True)
    numbers = (chunk_size, warps, stages, segment_chunks)
    call = PREPARED.get(prepared_key(arrays.key, settings, numbers), arrays, settings)
    return _run(call, arrays, q, stream, out, None, final_state, start_of)[:2]
