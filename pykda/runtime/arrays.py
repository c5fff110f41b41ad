"""Device arrays from any framework, seen as pointer + shape + element strides.

torch tensors and CuPy arrays are read directly (the hot path); JAX arrays and anything else
speaking DLPack or `__cuda_array_interface__` go through CuPy's importers. Outputs are made
in the framework of a reference array. Nothing here synchronizes the host.
"""
from __future__ import annotations

import functools
import sys

_TORCH_DTYPES: dict = {}   # torch.dtype -> name, filled on first torch tensor
_TORCH_BY_NAME: dict = {}  # name -> torch.dtype, filled by empty_like_framework
_NAMES = ("bfloat16", "float16", "float32", "float64", "int32", "int64", "uint8", "int8", "bool")
_TENSOR: type | None = None   # torch.Tensor, bound on the first call after torch is imported
_RAW_STREAM = None            # torch's current-stream getter (a C function), bound on first use
_EMPTY_LIKE = None            # (torch.empty_like, torch.contiguous_format), bound on first use
_new = object.__new__


class DeviceArray:
    """Pointer, shape, element strides, dtype name and device of an array (`obj` keeps it alive).

    Never modified after it is made: `meta` holds what validation may depend on (shape,
    strides, dtype, device and the pointer modulo 16), the key of `ops.checks.memoized`.
    """
    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "framework", "obj", "meta")

    def __init__(self, ptr, shape, strides, dtype, device, framework, obj):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self.framework = framework
        self.obj = obj
        self.meta = (shape, strides, dtype, device, ptr & 15)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"DeviceArray({self.framework}, {self.dtype}, shape={self.shape}, strides={self.strides})"


def _torch_dtype_name(dt) -> str:
    if not _TORCH_DTYPES:
        import torch
        for n in _NAMES:
            _TORCH_DTYPES[getattr(torch, n)] = n
    return _TORCH_DTYPES.get(dt, str(dt).removeprefix("torch."))


def _from_cupy(x, name: str, obj) -> DeviceArray:
    item = x.dtype.itemsize
    return DeviceArray(x.data.ptr, x.shape, tuple(s // item for s in x.strides), x.dtype.name,
                       x.device.id, "cupy", obj)


def _is_torch_tensor(x) -> bool:
    """isinstance(x, torch.Tensor) without importing torch; binds the fast path's type."""
    global _TENSOR
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if _TENSOR is None:
        _torch_dtype_name(None)   # fill the dtype table
        _TENSOR = torch.Tensor
    return isinstance(x, torch.Tensor)


def as_device_array(x, name: str) -> DeviceArray:
    """View `x` (torch, CuPy, JAX, DLPack, CUDA array interface) as a DeviceArray.

    Raises TypeError naming `name` for host arrays and objects that are not arrays.
    """
    if type(x) is _TENSOR or _is_torch_tensor(x):   # a plain tensor costs one type check
        if not x.is_cuda:
            raise TypeError(f"{name} must be a CUDA tensor; got a torch tensor on {x.device}")
        a = _new(DeviceArray)   # DeviceArray.__init__ inlined (a Python frame fewer)
        a.ptr = ptr = x.data_ptr()
        a.shape = shape = x.shape
        a.strides = strides = x.stride()
        dt = x.dtype
        a.dtype = dt = _TORCH_DTYPES.get(dt) or _torch_dtype_name(dt)
        a.device = dev = x.get_device()
        a.framework = "torch"
        a.obj = x
        a.meta = (shape, strides, dt, dev, ptr & 15)
        return a
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return _from_cupy(x, name, x)
    if mod.startswith("numpy") or isinstance(x, (list, tuple, int, float)):
        raise TypeError(f"{name} must be a GPU array (CuPy, torch, JAX or DLPack); got a host {type(x).__name__}")
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        import cupy
        if hasattr(x, "__dlpack_device__"):
            dev_type = int(x.__dlpack_device__()[0])
            if dev_type not in (2, 13):   # kDLCUDA, kDLCUDAManaged
                raise TypeError(f"{name} must be a GPU array; got a DLPack array on device type {dev_type}")
        try:
            view = cupy.from_dlpack(x) if hasattr(x, "__dlpack__") else cupy.asarray(x)
        except Exception as exc:   # e.g. bfloat16 without ml_dtypes
            raise TypeError(f"{name}: cannot import {type(x).__name__} as a device array: {exc}") from exc
        return _from_cupy(view, name, x)
    raise TypeError(f"{name} must be a GPU array (CuPy, torch, JAX or DLPack); got {type(x).__name__}")


def _cupy_dtype(name: str):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:   # pragma: no cover - ml_dtypes is a dependency
            raise TypeError("bfloat16 outputs for CuPy/JAX arrays need the ml_dtypes package") from None
        return ml_dtypes.bfloat16
    import numpy
    return numpy.dtype(name)


def empty_like_framework(ref: DeviceArray, shape: tuple, dtype: str):
    """A new uninitialized array of `shape`/`dtype` on ref's device, in ref's framework
    (CuPy for DLPack producers; `to_framework` hands it back in theirs)."""
    if ref.framework == "torch":
        dt = _TORCH_BY_NAME.get(dtype)
        if dt is None:
            import torch
            dt = _TORCH_BY_NAME[dtype] = getattr(torch, dtype)
        return ref.obj.new_empty(shape, dtype=dt)
    import cupy
    with cupy.cuda.Device(ref.device):
        return cupy.empty(shape, dtype=_cupy_dtype(dtype))


@functools.lru_cache(maxsize=256)
def contiguous_strides(shape: tuple) -> tuple:
    """Element strides of a C-contiguous array of `shape`."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def new_contiguous_like(ref: DeviceArray) -> DeviceArray:
    """A new uninitialized contiguous array with ref's shape and dtype, on ref's device, in
    ref's framework, already viewed (for torch only its pointer is read: the rest is known)."""
    if ref.framework == "torch":
        global _EMPTY_LIKE
        if _EMPTY_LIKE is None:
            import torch
            _EMPTY_LIKE = (torch.empty_like, torch.contiguous_format)
        obj = _EMPTY_LIKE[0](ref.obj, memory_format=_EMPTY_LIKE[1])
        return DeviceArray(obj.data_ptr(), ref.shape, contiguous_strides(ref.shape), ref.dtype, ref.device, "torch", obj)
    return as_device_array(empty_like_framework(ref, ref.shape, ref.dtype), "out")


def to_framework(ref: DeviceArray, arr):
    """Hand `arr` (made by empty_like_framework) back in the framework of `ref`."""
    if ref.framework == "torch" or type(ref.obj).__module__.startswith("cupy"):
        return arr
    if type(ref.obj).__module__.startswith("jax"):
        import jax.dlpack
        return jax.dlpack.from_dlpack(arr)
    return arr


def launch_stream(ref: DeviceArray, stream=None) -> int:
    """The stream handle to launch on: `stream` if given (int handle, CuPy or torch stream),
    else torch's current stream for torch arrays, else CuPy's current stream."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        raise TypeError(f"stream must be an int handle, a CuPy or a torch stream; got {type(stream).__name__}")
    if ref.framework == "torch":
        raw = _RAW_STREAM or _torch_raw_stream()
        return raw(ref.device)
    import cupy
    return cupy.cuda.get_current_stream(ref.device).ptr


def _torch_raw_stream():
    """torch's current-stream getter: its C function where it has one, else the public API."""
    global _RAW_STREAM
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _RAW_STREAM = raw if raw is not None else (lambda device: torch.cuda.current_stream(device).cuda_stream)
    return _RAW_STREAM
