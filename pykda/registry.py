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
    for p in problems:
        yield decode_spec(p, plan_decode(p, H200_SMS, H200_SMEM_PER_SM), arch)


def kda_decode_specs(arch: str) -> Iterator[KernelSpec]:
    from .ops.kda_decode import INDEX_CTYPES, KEY_DIMS, STATE_CTYPES, KdaDecodeProblem, kda_decode_spec
    for dim in KEY_DIMS:
        for state in STATE_CTYPES:
            for rpt in (1, 2, 4):
                for idx in INDEX_CTYPES:
                    p = KdaDecodeProblem(1, 1, 32, dim, 1, 1, state, idx, "int32")
                    yield kda_decode_spec(p, rpt, arch)
            yield kda_decode_spec(KdaDecodeProblem(1, 1, 32, dim, 1, 1, state, "int32", "int64"), 1, arch)


FAMILIES: dict[str, Callable[[str], Iterator[KernelSpec]]] = {
    "decode": decode_specs,
    "kda_decode": kda_decode_specs,
}


def specs(family: str | None, arch: str) -> list[KernelSpec]:
    """Distinct registered specs of `family` (all families when None), in a stable order."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    names = [family] if family else sorted(FAMILIES)
    return list(dict.fromkeys(s for n in names for s in FAMILIES[n](arch)))
