"""TMA tensor maps: checked in Python, encoded by the CUDA driver (cuTensorMapEncodeTiled).

A map describes a box walk over a strided tensor of up to 5 dimensions; the kernel gets the
128-byte encoding (a `bytes` here) by value as a `const __grid_constant__ TensorMap` parameter.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

DATA_TYPES = {"uint8": 0, "uint16": 1, "uint32": 2, "int32": 3, "uint64": 4, "int64": 5,
              "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
ITEMSIZE = {"uint8": 1, "uint16": 2, "uint32": 4, "int32": 4, "uint64": 8, "int64": 8,
            "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2}
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}   # bytes -> CUtensorMapSwizzle
L2_PROMOTION = {0: 0, 64: 1, 128: 2, 256: 3}   # bytes an L2 miss fetches -> CUtensorMapL2promotion
_TENSOR_MAP_DTYPE = np.dtype((np.void, 128))


class TensorMapError(ValueError):
    """A tensor cannot be described by the requested TMA map."""


def check_tiled(name: str, dtype: str, ptr: int, dims, strides, box, swizzle: int = 0, l2_promotion: int = 0) -> None:
    """Raise TensorMapError naming `name` unless the map can be encoded.

    dims/box are innermost-first element counts; strides are innermost-first byte strides
    of dims[1:] (the innermost dimension is contiguous).
    """
    if dtype not in DATA_TYPES:
        raise TensorMapError(f"{name}: dtype {dtype} has no TMA encoding")
    rank = len(dims)
    if not 1 <= rank <= 5 or len(box) != rank or len(strides) != rank - 1:
        raise TensorMapError(f"{name}: a TMA map needs 1..5 dims with one box size each "
                             f"and rank-1 strides (got dims {dims}, box {box}, strides {strides})")
    if ptr % 16:
        raise TensorMapError(f"{name}: base address must be 16-byte aligned for TMA (it is {ptr:#x})")
    for i, s in enumerate(strides):
        if s % 16 or s <= 0 or s >= 1 << 40:
            raise TensorMapError(f"{name}: stride {s} bytes of dim {i + 1} must be a positive "
                                 f"multiple of 16 bytes for TMA")
    for i, (d, b) in enumerate(zip(dims, box)):
        if not 1 <= d <= 1 << 32:
            raise TensorMapError(f"{name}: dim {i} has size {d}; TMA needs 1..2^32")
        if not 1 <= b <= 256:
            raise TensorMapError(f"{name}: box size {b} of dim {i} must be in 1..256")
    inner_bytes = box[0] * ITEMSIZE[dtype]
    if inner_bytes % 16:
        raise TensorMapError(f"{name}: innermost box of {inner_bytes} bytes must be a multiple of 16")
    if swizzle not in SWIZZLE:
        raise TensorMapError(f"{name}: swizzle must be one of {sorted(SWIZZLE)} bytes")
    if l2_promotion not in L2_PROMOTION:
        raise TensorMapError(f"{name}: l2_promotion must be one of {sorted(L2_PROMOTION)} bytes")
    if swizzle and inner_bytes > swizzle:
        raise TensorMapError(f"{name}: innermost box of {inner_bytes} bytes exceeds the {swizzle}-byte swizzle")


@functools.lru_cache(maxsize=None)
def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeError("pykda: the CUDA driver (libcuda.so.1) is not available") from exc
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def _encode(dtype: str, ptr: int, dims: tuple, strides: tuple, box: tuple, swizzle: int, l2_promotion: int) -> bytes:
    rank = len(dims)
    out = np.zeros((), dtype=_TENSOR_MAP_DTYPE)
    status = _driver()(
        out.ctypes.data, DATA_TYPES[dtype], rank, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*strides),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
        0, SWIZZLE[swizzle], L2_PROMOTION[l2_promotion], 0)   # no interleave; out-of-bounds reads give zeros
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {status} "
                           f"(dims {dims}, strides {strides}, box {box})")
    return out.tobytes()


_encoded: dict[tuple, bytes] = {}


def encode_tiled(name: str, dtype: str, ptr: int, dims: tuple, strides: tuple, box: tuple,
                 swizzle: int = 0, l2_promotion: int = 0) -> bytes:
    """Check, then encode a tiled tensor map (memoized per geometry): its 128 bytes.

    `l2_promotion` (0, 64, 128 or 256 bytes) widens the L2's fetch on a miss; 0 fetches what the
    box asks for."""
    key = (dtype, ptr, dims, strides, box, swizzle, l2_promotion)
    tmap = _encoded.get(key)
    if tmap is None:
        check_tiled(name, dtype, ptr, dims, strides, box, swizzle, l2_promotion)
        if len(_encoded) >= 4096:
            _encoded.clear()
        tmap = _encoded[key] = _encode(*key)
    return tmap


class TiledMaps:
    """Tensor maps of one geometry (dims, strides, box, swizzle) at any base address: each
    address's map is checked and encoded once (`encode_tiled`), then found by the address alone."""
    __slots__ = ("geometry", "_maps")

    def __init__(self, name: str, dtype: str, dims: tuple, strides: tuple, box: tuple, swizzle: int = 0,
                 l2_promotion: int = 0):
        self.geometry = (name, dtype, dims, strides, box, swizzle, l2_promotion)
        self._maps: dict[int, bytes] = {}

    def __call__(self, ptr: int) -> bytes:
        tmap = self._maps.get(ptr)
        if tmap is None:
            name, dtype, dims, strides, box, swizzle, l2_promotion = self.geometry
            tmap = encode_tiled(name, dtype, ptr, dims, strides, box, swizzle, l2_promotion)
            if len(self._maps) >= 1024:
                self._maps.clear()
            self._maps[ptr] = tmap
        return tmap
