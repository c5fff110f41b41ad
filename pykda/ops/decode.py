"""Flash decoding for one query token per head: `single_decode_with_kv_cache`.

validate -> plan (chunk size, pipeline, grid) -> spec -> kernel -> tensor maps + workspace -> launch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import runtime
from ..runtime.arrays import DeviceArray, as_device_array, empty_like_framework, launch_stream, to_framework
from .checks import (check_aligned, check_dtype, check_inner_contiguous, check_ndim, check_same_device, check_shape, check_stages, memoized, resolve_scale)

HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
CTYPES = {"bfloat16": "bf16_t", "float16": "fp16_t"}
BLOCK_N = 64          # KV rows per pipeline tile
WARPS = 4             # consumer warps; one more warp produces
MAX_HEADS_PER_CTA = 16
DEFAULT_STAGES = {64: 4, 128: 3, 256: 3}
_REGS_GUESS = {64: 96, 128: 152, 256: 240}   # per thread, for the occupancy estimate


class DecodeProblem(NamedTuple):
    kv_len: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


@dataclass(frozen=True)
class DecodePlan:
    chunk: int            # KV rows per CTA
    stages: int
    n_chunks: int
    head_blocks: int      # CTAs per KV head along the query heads
    heads_per_cta: int
    smem: int             # dynamic shared memory per CTA, bytes

    @property
    def split(self) -> bool:
        return self.n_chunks > 1


def stage_bytes(head_dim: int) -> int:
    return 2 * BLOCK_N * head_dim * 2


def smem_bytes(head_dim: int, stages: int) -> int:
    return stages * stage_bytes(head_dim) + 1024   # + alignment slack for 1024-byte TMA tiles


def ctas_per_sm(head_dim: int, stages: int, smem_per_sm: int) -> int:
    by_smem = smem_per_sm // (smem_bytes(head_dim, stages) + 2048)   # + static smem and reserve
    by_regs = 65536 // ((WARPS + 1) * 32 * _REGS_GUESS[head_dim])
    return max(1, min(by_smem, by_regs))


@functools.lru_cache(maxsize=1024)
def plan_decode(p: DecodeProblem, sm_count: int, smem_per_sm: int, chunk_size: int | None = None,
                stages: int | None = None) -> DecodePlan:
    """Choose the chunk size so that every SM has work and the last wave is full.

    Candidate chunks are powers of two times the tile; cost = waves x (tiles per chunk + a
    tile and a half of prologue/epilogue) + a merge pass when split.
    """
    stages = stages or DEFAULT_STAGES[p.head_dim]
    heads_per_cta = min(p.group, MAX_HEADS_PER_CTA)
    head_blocks = -(-p.group // heads_per_cta)
    units = p.kv_heads * head_blocks
    n_tiles = -(-p.kv_len // BLOCK_N)
    if chunk_size is not None:
        if chunk_size <= 0 or chunk_size % BLOCK_N:
            raise ValueError(f"chunk_size must be a positive multiple of {BLOCK_N}; got {chunk_size}")
        tiles = chunk_size // BLOCK_N
    else:
        slots = sm_count * ctas_per_sm(p.head_dim, stages, smem_per_sm)
        best = None
        for tiles in (1 << i for i in range(max(1, n_tiles).bit_length() + 1)):
            n_chunks = -(-n_tiles // tiles)
            waves = -(-(n_chunks * units) // slots)
            cost = waves * (tiles + 1.5) + (2.0 + n_chunks / 16 if n_chunks > 1 else 0.0)
            if best is None or cost < best[0]:
                best = (cost, tiles)
            if n_chunks == 1:
                break
        tiles = best[1]
    n_chunks = -(-n_tiles // tiles)
    return DecodePlan(chunk=tiles * BLOCK_N, stages=stages, n_chunks=n_chunks, head_blocks=head_blocks,
                      heads_per_cta=heads_per_cta, smem=smem_bytes(p.head_dim, stages))


@functools.lru_cache(maxsize=1024)
def decode_spec(p: DecodeProblem, plan: DecodePlan, arch: str) -> runtime.KernelSpec:
    return runtime.KernelSpec.make("decode", {
        "D": p.head_dim, "DTYPE": CTYPES[p.dtype], "BLOCK_N": BLOCK_N, "STAGES": plan.stages,
        "CHUNK": plan.chunk, "WARPS": WARPS, "SPLIT": plan.split}, arch,
        kernels=("decode_partial", "decode_merge"))


@memoized
def validate_decode(q: DeviceArray, k: DeviceArray, v: DeviceArray, out: DeviceArray | None) -> DecodeProblem:
    """Check dtypes, ranks, shapes, head ratio, head dim, layout and alignment; no GPU needed."""
    check_ndim(q, "q", 2, "[num_qo_heads, head_dim]")
    check_ndim(k, "k", 3, "[kv_len, num_kv_heads, head_dim]")
    check_ndim(v, "v", 3, "[kv_len, num_kv_heads, head_dim]")
    check_dtype(q, "q", DTYPES)
    for name, a in (("k", k), ("v", v)):
        if a.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}); got {a.dtype}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    hq, d = q.shape
    s, hkv, dk = k.shape
    if dk != d:
        raise ValueError(f"k/v head_dim {dk} must equal q's head_dim {d}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}; got {d}")
    if s < 1:
        raise ValueError(f"k/v must hold at least one KV row; got kv_len {s}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv})")
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_inner_contiguous(a, name)
        check_aligned(a, name, 16)
    if out is not None:
        check_shape(out, "out", (hq, d), "[num_qo_heads, head_dim]")
        if out.dtype != q.dtype:
            raise TypeError(f"out must have the dtype of q ({q.dtype}); got {out.dtype}")
        check_inner_contiguous(out, "out")
        check_aligned(out, "out", 8)
    check_same_device({"q": q, "k": k, "v": v, **({"out": out} if out is not None else {})})
    return DecodeProblem(kv_len=s, q_heads=hq, kv_heads=hkv, head_dim=d, dtype=q.dtype)


@functools.lru_cache(maxsize=1024)
def _kernels_for(p: DecodeProblem, device: int, chunk_size: int | None, stages: int | None):
    """The plan and the compiled partial and merge kernels for `p` on `device`."""
    dev = runtime.device_info(device)
    plan = plan_decode(p, dev.sm_count, dev.smem_per_sm, chunk_size, stages)
    if plan.smem > dev.smem_per_block_optin:
        raise ValueError(f"stages={plan.stages} needs {plan.smem} bytes of shared memory per block; "
                         f"the device allows {dev.smem_per_block_optin}")
    spec = decode_spec(p, plan, dev.arch)
    return plan, runtime.get_kernel(spec, device, "decode_partial"), runtime.get_kernel(spec, device, "decode_merge")


def kv_tensor_map(a: DeviceArray, name: str) -> bytes:
    """3-D map (head_dim, kv_heads, kv_len) with 64-column, BLOCK_N-row, 128-byte-swizzled boxes."""
    s, h, d = a.shape
    item = 2
    return runtime.encode_tiled(name, a.dtype, a.ptr, (d, h, s),
                                (a.strides[1] * item, a.strides[0] * item), (64, 1, BLOCK_N), swizzle=128)


def single_decode_with_kv_cache(q, k, v, *, scale: float | None = None, out=None, return_lse: bool = False,
                                stream=None, chunk_size: int | None = None, stages: int | None = None):
    """Decode attention of one query token per head: softmax(scale · q Kᵀ) V.

    q: [num_qo_heads, head_dim]; k, v: [kv_len, num_kv_heads, head_dim] (strided views of a
    larger cache allowed where TMA can express them); bf16 or fp16; head_dim 64, 128 or 256;
    num_qo_heads a multiple of num_kv_heads (query head i reads KV head i // group).
    Returns o [num_qo_heads, head_dim] in q's framework (or `out`), and with `return_lse`
    also the natural-log log-sum-exp of the scaled scores, [num_qo_heads] fp32.
    `chunk_size` (KV rows per CTA, a multiple of 64) and `stages` override the planner.
    """
    qa, ka, va = as_device_array(q, "q"), as_device_array(k, "k"), as_device_array(v, "v")
    oa = as_device_array(out, "out") if out is not None else None
    p = validate_decode(qa, ka, va, oa)
    scale = resolve_scale(scale, p.head_dim)
    check_stages(stages)
    runtime.require_gpu()
    plan, partial, merge = _kernels_for(p, qa.device, chunk_size, stages)
    strm = launch_stream(qa, stream)

    if out is None:
        out = empty_like_framework(qa, (p.q_heads, p.head_dim), p.dtype)
        oa = as_device_array(out, "out")
    lse = empty_like_framework(qa, (p.q_heads,), "float32") if return_lse else None
    lse_ptr = as_device_array(lse, "lse").ptr if return_lse else 0
    k_map, v_map = kv_tensor_map(ka, "k"), kv_tensor_map(va, "v")
    i32 = np.int32
    ws_o = ws_lse = 0
    if plan.split:
        n_part = p.q_heads * plan.n_chunks
        ws_o = runtime.workspace(qa.device, strm, n_part * (p.head_dim + 1) * 4)
        ws_lse = ws_o + n_part * p.head_dim * 4
    partial.launch(
        (plan.n_chunks, p.kv_heads, plan.head_blocks), ((WARPS + 1) * 32, 1, 1),
        (qa.ptr, np.int64(qa.strides[0]), k_map, v_map, i32(p.kv_len), i32(p.group),
         i32(plan.heads_per_cta), np.float32(scale), ws_o, ws_lse, oa.ptr, np.int64(oa.strides[0]), lse_ptr),
        plan.smem, strm)
    if plan.split:
        merge.launch((p.q_heads, 1, 1), (128, 1, 1),
                     (ws_o, ws_lse, i32(plan.n_chunks), oa.ptr, np.int64(oa.strides[0]), lse_ptr),
                     plan.n_chunks * 4, strm)
    out = to_framework(qa, out)
    return (out, to_framework(qa, lse)) if return_lse else out
