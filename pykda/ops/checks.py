"""Argument checks shared by the ops: each raises TypeError/ValueError naming the argument."""
from __future__ import annotations

import math

import numpy as np

from ..runtime.arrays import DeviceArray, contiguous_strides

FLOAT32_MAX = 3.4028234663852886e38
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}


def check_dtype(a: DeviceArray, name: str, allowed: tuple[str, ...]) -> None:
    if a.dtype not in allowed:
        raise TypeError(f"{name} must have dtype {' or '.join(allowed)}; got {a.dtype}")


def check_ndim(a: DeviceArray, name: str, ndim: int, layout: str) -> None:
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}; got shape {tuple(a.shape)}")


def check_shape(a: DeviceArray, name: str, shape: tuple, layout: str) -> None:
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {layout} = {tuple(shape)}; got {tuple(a.shape)}")


def check_same_device(arrays: dict[str, DeviceArray]) -> int:
    devices = {name: a.device for name, a in arrays.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        raise ValueError(f"all arrays must be on one device; got {devices}")
    return first


def check_inner_contiguous(a: DeviceArray, name: str) -> None:
    if a.strides[-1] != 1 and a.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous in its last dimension; got strides {a.strides}")


def check_aligned(a: DeviceArray, name: str, nbytes: int = 16) -> None:
    """Base address and every outer stride aligned to `nbytes` (vectorized access, TMA).
    `nbytes` divides 16: the memo of validated calls keys the base address modulo 16 only."""
    if 16 % nbytes:
        raise AssertionError(f"check_aligned: nbytes must divide 16 (the memo of validated calls keys the address "
                             f"modulo 16); got {nbytes}")
    item = ITEMSIZE[a.dtype]
    if a.ptr % nbytes:
        raise ValueError(f"{name} must start at a {nbytes}-byte aligned address; got {a.ptr:#x}")
    for dim, (size, stride) in enumerate(zip(a.shape[:-1], a.strides[:-1])):
        if size > 1 and (stride * item) % nbytes:
            raise ValueError(f"{name}: stride {stride} of dim {dim} is {stride * item} bytes; "
                             f"it must be a multiple of {nbytes} bytes")


def check_contiguous(a: DeviceArray, name: str) -> None:
    expected = contiguous_strides(tuple(a.shape))
    if any(s != e for s, e, n in zip(a.strides, expected, a.shape) if n > 1):
        raise ValueError(f"{name} must be contiguous; got strides {a.strides} for shape {tuple(a.shape)}")


def check_rows_contiguous(a: DeviceArray, name: str) -> None:
    """Contiguous within each row of dim 0; the rows themselves any distance apart that keeps them
    from overlapping (a pool that is a view into a larger cache, one row per slot)."""
    inner = contiguous_strides(tuple(a.shape[1:]))
    if any(s != e for s, e, n in zip(a.strides[1:], inner, a.shape[1:]) if n > 1):
        raise ValueError(f"{name} must be contiguous within each row (all dims but the first); got strides "
                         f"{a.strides} for shape {tuple(a.shape)}")
    row = math.prod(a.shape[1:])
    if a.shape[0] > 1 and a.strides[0] < row:
        raise ValueError(f"{name}'s rows overlap: stride {a.strides[0]} of dim 0 is below a row's {row} elements")


def resolve_scale(scale, dim: int) -> float:
    """The softmax/readout scale: 1/sqrt(dim) by default; must be finite."""
    scale = float(scale) if scale is not None else dim ** -0.5
    if not math.isfinite(scale) or abs(scale) > FLOAT32_MAX:   # kernels take it as a float
        raise ValueError(f"scale must be finite in float32; got {scale}")
    return scale


def is_int(x) -> bool:
    """A Python or NumPy int, not a bool (a setting that reaches templates and launch geometry)."""
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


def check_stages(stages) -> None:
    """A pipeline-depth override: None (the planner's) or an int in 2..8."""
    if stages is not None and not (is_int(stages) and 2 <= stages <= 8):
        raise ValueError(f"stages must be in 2..8; got {stages!r} (an int is needed)" if not is_int(stages)
                         else f"stages must be in 2..8; got {stages!r}")


def check_lower_bound(lower_bound) -> float:
    """The gate's lower bound (log space): finite and <= 0."""
    lb = float(lower_bound)
    if not math.isfinite(lb) or lb > 0:
        raise ValueError(f"lower_bound must be finite and <= 0; got {lower_bound}")
    return lb


def prepared_key(arrays_key, settings: tuple, numbers: tuple) -> tuple:
    """A prepared call's key: its arrays' key, its settings as given, and the types of those of
    them that are numbers. Settings are checked only when a call is prepared, so a bad 4.0 or
    True must not find the call prepared for the 4 or 1 it compares equal to."""
    return arrays_key, settings, tuple(map(type, numbers))


class Memo:
    """Results of `make` by key. The last call's key and result are kept apart: a repeat of
    the last call (the decode loop) compares keys without hashing them. A call that raises
    caches nothing; nor does one whose key cannot be hashed."""
    __slots__ = ("make", "results", "last")

    def __init__(self, make):
        self.make = make
        self.results: dict = {}
        self.last = (None, None)   # (key, result), replaced as a whole

    def clear(self) -> None:
        """Forget every result."""
        self.results.clear()
        self.last = (None, None)

    def get(self, key, *args):
        """make(*args), cached under `key`."""
        last = self.last
        if key == last[0]:
            return last[1]
        try:
            hit = self.results.get(key)
        except TypeError:   # an unhashable setting: make, cache nothing
            return self.make(*args)
        if hit is None:
            hit = self.make(*args)
            if len(self.results) >= 4096:
                self.results.clear()
            self.results[key] = hit
        self.last = (key, hit)
        return hit
