"""The registered specializations of each kernel family, for offline compilation.

A family's specializations are the ones its planner picks for a set of reference problems
on an H200 (132 SMs, 228 KB of shared memory per SM): PERF.md's shapes and the test shapes.
"""
from __future__ import annotations

from typing import Callable, Iterator

from .runtime import KernelSpec

H200_SMS, H200_SMEM_PER_SM = 132, 233472


def decode_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.decode import DTYPES, HEAD_DIMS, DecodeProblem, decode_spec, plan_decode
    problems = [DecodeProblem(s, 32, hkv, 128, "bfloat16")
                for hkv in (32, 8) for s in (8192, 16384, 32768, 65536, 131072, 131073)]
    problems += [DecodeProblem(s, hq, hkv, d, dt) for d in HEAD_DIMS for dt in DTYPES
                 for s in (1, 1000, 8192, 131073) for hq, hkv in ((32, 32), (32, 8), (8, 1))]
    problems += [DecodeProblem(s, 32, 8, 128, "bfloat16", b) for b, s in ((64, 4096), (256, 1024), (8, 32768))]
    problems += [DecodeProblem(s, hq, hkv, d, dt, b) for d in HEAD_DIMS for dt in DTYPES for b in (3, 8)
                 for s in (17, 1000, 8192) for hq, hkv in ((32, 8), (8, 8), (8, 1))]
    for p in problems:
        yield decode_spec(p, plan_decode(p, H200_SMS, H200_SMEM_PER_SM), arch)


def kda_decode_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.kda import HEAD_DIMS
    from .ops.kda_decode import (INDEX_CTYPES, STATE_CTYPES, KdaDecodeProblem, default_stages, kda_decode_spec,
                                 tile_rows)
    for dim in HEAD_DIMS:
        for state in STATE_CTYPES:
            for idx in INDEX_CTYPES:
                p = KdaDecodeProblem(1, 1, 32, dim, 1, 1, state, idx, "int32")
                for rpt in (1, 2, 4, 8):
                    if tile_rows(p, rpt) <= dim:
                        yield kda_decode_spec(p, rpt, default_stages(p, rpt, H200_SMEM_PER_SM), arch)
            packed = KdaDecodeProblem(1, 6, 32, dim, 3, 4, state, "int32", "int64")
            yield kda_decode_spec(packed, 1, default_stages(packed, 1, H200_SMEM_PER_SM), arch)


def kda_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.kda import CHUNK_SIZES, HEAD_DIMS, KdaProblem, kda_specs as specs_of, plan_kda
    problems = [KdaProblem(1, t, h, 128, n, n > 1, 16, "float32")
                for h, t, n in ((96, 8192, 1), (96, 8192, 6), (96, 8192, 8), (64, 8192, 1), (64, 8192, 6),
                                (64, 8192, 8), (32, 32768, 1), (32, 8192, 1), (8, 32768, 1), (16, 65536, 1),
                                (4, 262144, 1))]
    problems += [KdaProblem(b, t, h, d, n, n != b, c, "float32") for d in HEAD_DIMS for c in CHUNK_SIZES
                 for b, t, h, n in ((2, 4096, 2, 2), (1, 5148, 2, 7), (1, 4096, 8, 1), (1, 100, 64, 1))]
    for p in problems:
        yield from specs_of(p, plan_kda(p, H200_SMS), arch)
    for d in HEAD_DIMS:   # every V split the planner (or the `warps` override) can pick
        for c in CHUNK_SIZES:
            for w in (1, 2, 4, 8)[: 3 if d == 64 else 4]:
                p = KdaProblem(1, 4096, 8, d, 1, False, c, "float32")
                yield from specs_of(p, plan_kda(p, H200_SMS, warps=w), arch)


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
