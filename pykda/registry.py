"""The registered specializations of each kernel family, for offline compilation.

A family's specializations are the ones its planner picks for a set of reference problems
on an H200 (132 SMs, 228 KB of shared memory per SM): PERF.md's shapes and the test shapes
(decode's: every kernel its planner can pick, few now that the chunk is a kernel argument).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterator

from .runtime import KernelSpec

H200_SMS, H200_SMEM_PER_SM = 132, 233472


def decode_specs(arch: str) -> Iterator[KernelSpec]:
    """Every kernel the decode planner can pick at its default stages (head dim 128: 4 for calls of at
    most an SM's units, 3 for more): the chunk is a kernel argument, so a kernel is a head dim, a
    dtype, split or not (merged by decode_merge or in a cluster of 2, 4 or 8 CTAs, or the balanced
    split), a cache (padded, or paged with each page size of pykda.BatchDecodeWithPagedKVCache,
    gathered below 16 rows and in one-tile CTAs), and CTAs of at most 8 query heads (transposed
    products: 32/8 heads) or more (64/4). Padded caches also take each chunked kernel with its
    chunks' last tiles in boxes of PADDED_BOX_ROWS rows (a batch with lengths on the device, which
    any of them may run); their one-tile CTAs gather their rows in their warps, and keep the TMA
    kernels for a K and V of different strides. And decode_tiny, the short calls' kernel (padded or paged): rows
    (TINY_ROWS), a head dim, a dtype and a group of 1, 2, 4 or 8 (those within its TINY_MAX_COLUMNS)."""
    from .ops.decode import (CLUSTERS, DTYPES, HEAD_DIMS, PADDED_BOX_ROWS, TILE_ROWS, TINY_ROWS, DecodeProblem,
                             decode_spec, decode_stages, is_gathered, plan_decode)
    from .ops.paged_decode import PAGE_SIZES, snapshot_spec

    def spec(p, plan, page):   # and, for padded caches, the kernel with its tails in boxes (and where the
                               # warps gather their rows, the TMA kernels for K and V of different strides)
        yield decode_spec(p, plan, arch, page)
        if not page and plan.self_gather:
            yield from spec(p, dataclasses.replace(plan, self_gather=False), page)
        elif not page and plan.block_n > PADDED_BOX_ROWS:
            yield decode_spec(p, dataclasses.replace(plan, box_rows=PADDED_BOX_ROWS), arch, page)
    for page in (0,) + PAGE_SIZES:
        gathered = is_gathered(page)
        for d, dt, (hq, hkv) in itertools.product(HEAD_DIMS, DTYPES, ((32, 8), (64, 4))):
            # the streaming stages of calls of at most an SM's units and of more (D 128 in boxes: 4 and 3)
            depths = dict.fromkeys(decode_stages(d, units, H200_SMS, gathered) for units in (1, H200_SMS + 1))
            for s in (1, 33, 65, 257, 131073):   # short tiles of 32 and 64 rows, one tile (D 64: 128 rows), one chunk
                                                 # of tiles; split
                # one sequence; a batch of more units than SMs (split at 131073 rows, 32/8 and 64/4 heads)
                one, many = (DecodeProblem(s, hq, hkv, d, dt, batch) for batch in (1, 40))
                one_plan = plan_decode(one, H200_SMS, H200_SMEM_PER_SM, gathered=gathered)
                yield from spec(one, one_plan, page)
                yield from spec(many, plan_decode(many, H200_SMS, H200_SMEM_PER_SM, gathered=gathered), page)
                for stages in depths:
                    if one_plan.split:   # the split's chunks in clusters (a batch of many waves): as many as each holds
                        for c in CLUSTERS:
                            rows = -(-s // (c * TILE_ROWS[d])) * TILE_ROWS[d]   # ceil(s / c) in whole tiles
                            split = plan_decode(many, H200_SMS, H200_SMEM_PER_SM, chunk_size=rows, stages=stages)
                            assert split.cluster == c, (split, c)
                            yield from spec(many, split, page)
                    # the balanced split
                    yield decode_spec(many, plan_decode(many, H200_SMS, H200_SMEM_PER_SM, balanced=True, stages=stages),
                                      arch, page)
    # decode_tiny: a kernel for each of its row counts, head dims, dtypes and compiled groups it takes
    for rows, d, dt, group in itertools.product(TINY_ROWS, HEAD_DIMS, DTYPES, (1, 2, 4, 8)):
        plan = plan_decode(p := DecodeProblem(rows, 8 * group, 8, d, dt), H200_SMS, H200_SMEM_PER_SM, tiny=True)
        if plan.tiny:
            yield decode_spec(p, plan, arch)
    yield snapshot_spec(arch)   # plan()'s copy of each request's first page ids, for decode_tiny


def kda_decode_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.kda import HEAD_DIMS
    from .ops.kda_decode import (INDEX_CTYPES, MMA_MAX_TOKENS, STATE_CTYPES, KdaDecodeProblem,
                                 default_stages, kda_decode_mma_spec, kda_decode_spec, plan_kda_decode, tile_rows)
    from .ops.kda_variant import BETAS, GATES, KdaVariant
    safe = KdaVariant("safe", "logit", True, "bfloat16", "bfloat16", -5.0)
    softplus = KdaVariant("softplus", "logit", True, "bfloat16", "bfloat16", 0.0)
    vllm = KdaVariant("none", "prob", True, "float32", "float32", 0.0)   # vLLM's decode: its own gate, sigmoid(b)
    yield from kda_decode_kfirst_specs(arch, safe, softplus, vllm)
    for dim in HEAD_DIMS:
        for state in STATE_CTYPES:
            for variant in (safe, softplus, vllm):
                for idx in INDEX_CTYPES:
                    p = KdaDecodeProblem(1, 1, 32, dim, 1, 1, state, idx, "int32", variant)
                    for rpt in (1, 2, 4, 8):
                        if tile_rows(p, rpt) <= dim:
                            yield kda_decode_spec(p, rpt, default_stages(p, rpt, H200_SMEM_PER_SM), arch)
                packed = KdaDecodeProblem(1, 6, 32, dim, 3, 4, state, "int32", "int64", variant)
                yield kda_decode_spec(packed, 1, default_stages(packed, 1, H200_SMEM_PER_SM), arch)
                # speculative decode (2-D state_indices, num_accepted_tokens): the planner's tiles at
                # B 64 H 32, T 4 in every mode, T 2 and 8 in vLLM's; packed as vLLM calls it
                for t in (2, 4, 8) if variant is vllm else (4,):
                    spec = KdaDecodeProblem(64, t, 32, dim, 64, 64, state, "int32", "int32", variant, t, "int32")
                    plan = plan_kda_decode(spec, H200_SMS, H200_SMEM_PER_SM)
                    yield kda_decode_spec(spec, plan.rpt, plan.stages, arch)
                spec = KdaDecodeProblem(1, 12, 32, dim, 3, 4, state, "int64", "int32", variant, 4, "int64")
                yield kda_decode_spec(spec, 1, default_stages(spec, 1, H200_SMEM_PER_SM), arch)
                if variant is softplus:   # SGLang's target verify: 64 requests of 4 tokens, packed; a chain
                    verify = KdaDecodeProblem(1, 256, 32, dim, 64, 128, state, "int32", "int32", variant,
                                              verify_steps=4, verify_slots=64)   # and a tree of drafts
                    for tree in (verify, verify._replace(parent_cols=4, parent_dtype="int64")):
                        plan = plan_kda_decode(tree, H200_SMS, H200_SMEM_PER_SM)
                        yield kda_decode_spec(tree, plan.rpt, plan.stages, arch)
        for variant in (safe, softplus, vllm):   # the tensor-core step: every token count it takes
            for idx in INDEX_CTYPES:
                for t in range(1, MMA_MAX_TOKENS + 1):
                    yield kda_decode_mma_spec(KdaDecodeProblem(64, t, 32, dim, 64, 64, "bfloat16", idx, "int32",
                                                               variant), arch)
        for gate in GATES:   # every gate mode, β form and dtype pair at the test shape
            for beta in BETAS:
                for gd in ("bfloat16", "float32"):
                    for bd in ("bfloat16", "float32"):
                        if (gd == "float32" and gate != "none") or (bd == "float32" and beta != "prob"):
                            continue
                        for norm in (False, True):
                            var = KdaVariant(gate, beta, norm, gd, bd, -5.0 if gate == "safe" else 0.0)
                            p = KdaDecodeProblem(1, 1, 4, dim, 1, 1, "float32", "int32", "int32", var)
                            rpt = next(r for r in (8, 4, 2, 1) if tile_rows(p, r) <= dim)
                            yield kda_decode_spec(p, rpt, default_stages(p, rpt, H200_SMEM_PER_SM), arch)
                            yield kda_decode_mma_spec(p._replace(tokens=4, state_dtype="bfloat16"), arch)


def kda_decode_kfirst_specs(arch: str, *variants) -> Iterator[KernelSpec]:
    """K-first pools [P, H, K, V] (whole-state tiles, so no rows-per-thread sweep): the V-first
    list's problems in each of `variants` (safe, softplus, vLLM's), and every gate mode and β form
    at the test shape."""
    from .ops.kda import HEAD_DIMS
    from .ops.kda_decode import INDEX_CTYPES, STATE_CTYPES, KdaDecodeProblem, kda_decode_spec, plan_kda_decode
    from .ops.kda_variant import BETAS, GATES, KdaVariant

    def spec(b, t, h, dim, n, pool, state, idx, cu, variant, cols=0, acc="int32"):
        p = KdaDecodeProblem(b, t, h, dim, n, pool, state, idx, cu, variant, cols, acc, v_first=False)
        plan = plan_kda_decode(p, H200_SMS, H200_SMEM_PER_SM)
        return kda_decode_spec(p, plan.rpt, plan.stages, arch)
    for dim in HEAD_DIMS:
        for state in STATE_CTYPES:
            for variant in variants:
                for idx in INDEX_CTYPES:
                    yield spec(1, 1, 32, dim, 1, 1, state, idx, "int32", variant)
                yield spec(1, 6, 32, dim, 3, 4, state, "int32", "int64", variant)   # packed
                for t in (2, 4, 8) if variant.gate == "none" else (4,):   # speculative decode, B 64 H 32
                    yield spec(64, t, 32, dim, 64, 64, state, "int32", "int32", variant, t, "int32")
                yield spec(1, 12, 32, dim, 3, 4, state, "int64", "int32", variant, 4, "int64")
        for gate in GATES:
            for beta in BETAS:
                for norm in (False, True):
                    var = KdaVariant(gate, beta, norm, "bfloat16", "bfloat16", -5.0 if gate == "safe" else 0.0)
                    yield spec(1, 1, 4, dim, 1, 1, "float32", "int32", "int32", var)


def kda_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.kda import CHUNK_SIZES, HEAD_DIMS, KdaProblem, kda_specs as specs_of, plan_kda
    from .ops.kda_variant import BETAS, GATES, KdaVariant

    SOFTPLUS = KdaVariant("softplus", "logit", True, "bfloat16", "bfloat16", 0.0)
    SAFE = KdaVariant("safe", "logit", True, "bfloat16", "bfloat16", -5.0)

    def problem(b, t, h, d, n, c, variant=SOFTPLUS, v_first=False):
        return KdaProblem(b, t, h, d, n, n != b or b == 1 and n > 1, c, "float32", variant, v_first, n)
    problems = [problem(1, t, h, 128, n, 16, var) for var in (SOFTPLUS, SAFE)
                for h, t, n in ((96, 8192, 1), (96, 8192, 6), (96, 8192, 8), (64, 8192, 1), (64, 8192, 6),
                                (64, 8192, 8), (32, 32768, 1), (32, 8192, 1), (8, 32768, 1), (16, 65536, 1),
                                (4, 262144, 1))]
    problems += [problem(b, t, h, d, n, c, v_first=vf) for d in HEAD_DIMS for c in CHUNK_SIZES for vf in (False, True)
                 for b, t, h, n in ((2, 4096, 2, 2), (1, 5148, 2, 7), (1, 4096, 8, 1), (1, 100, 64, 1))]
    # every gate mode, β form and dtype pair (vLLM's calls: precomputed fp32 g, fp32 β probabilities)
    problems += [problem(1, 4096, 8, d, 1, 16, KdaVariant(gate, beta, norm, gd, bd, -5.0 if gate == "safe" else 0.0))
                 for d in HEAD_DIMS for gate in GATES for beta in BETAS for norm in (False, True)
                 for gd in ("bfloat16", "float32") for bd in ("bfloat16", "float32")
                 if (gd == "bfloat16" or gate == "none") and (bd == "bfloat16" or beta == "prob")]
    # one head (or two) of a long sequence: the scan in two levels (scan_groups)
    problems += [problem(1, 1 << 20, 1, 128, 1, 16), problem(1, 1 << 19, 2, 128, 1, 16)]
    problems += [problem(1, 32768, 1, d, 1, c) for d in HEAD_DIMS for c in CHUNK_SIZES]
    for p in problems:
        yield from specs_of(p, plan_kda(p, H200_SMS), arch)
    for d in HEAD_DIMS:   # every V split the planner (or the `warps` override) can pick, with and without segments
        for c in CHUNK_SIZES:
            for w in (1, 2, 4, 8)[: 3 if d == 64 else 4]:
                for seg in (0, 4):
                    p = problem(1, 4096, 8, d, 1, c)
                    yield from specs_of(p, plan_kda(p, H200_SMS, warps=w, segment_chunks=seg), arch)
    # checkpoints (return_intermediate_states): the test shapes, whole and in segments
    for d in HEAD_DIMS:
        for c in CHUNK_SIZES:
            for p in (problem(2, 1000, 2, d, 2, c), problem(1, 5148, 2, d, 7, c, v_first=True)):
                for seg in (None, 3):
                    yield from specs_of(p, plan_kda(p, H200_SMS, segment_chunks=seg), arch, checkpoints=True)
    # a rank's slice (pykda.distributed): the test shapes and the context-parallel bench's
    slices = [problem(b, t, h, d, b, c) for d in HEAD_DIMS for c in CHUNK_SIZES for b, t, h in ((2, 1000, 2), (1, 4096, 8))]
    slices += [problem(1, t, h, 128, 1, 16) for t in (262144, 524288) for h in (8, 32)]
    for p in slices:
        yield from specs_of(p, plan_kda(p, H200_SMS, rank=True), arch)


FAMILIES: dict[str, Callable[[str], Iterator[KernelSpec]]] = {
    "decode": decode_specs,
    "kda_decode": kda_decode_specs,
    "kda": kda_specs,
}


def specs(family: str | None, arch: str) -> list[KernelSpec]:
    """Distinct registered specs of `family` (all families when None), in a stable order."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    names = [family] if family else sorted(FAMILIES)
    return list(dict.fromkeys(s for n in names for s in FAMILIES[n](arch)))
