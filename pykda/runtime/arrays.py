"""Device arrays from any framework, seen as pointer + shape + element strides.

torch tensors and CuPy arrays are read directly (the hot path); JAX arrays and anything else
speaking DLPack or `__cuda_array_interface__` go through CuPy's importers. Outputs are made
in the framework of a reference array. Nothing here synchronizes the host.
"""
from __future__ import annotations

import functools
import sys

_TORCH_DTYPES: dict = {}   # torch.dtype -> name, filled on first torch tensor
_TORCH_BY_NAME: dict = {}  # name -> torch.dtype, filled by _torch_new_empty
_NAMES = ("bfloat16", "float16", "float32", "float64", "int32", "int64", "uint8", "int8", "bool")
_TENSOR: type | None = None   # torch.Tensor, bound on the first call after torch is imported
_PARAMETER: type | None = None   # torch.nn.Parameter, bound with it
_RAW_STREAM = None            # torch's current-stream getter (a C function), bound on first use
_EMPTY_LIKE = None            # (torch.empty_like, torch.contiguous_format), bound on first use
_RAW_BLOCKS: tuple = ()       # torch's raw block functions (_torch_raw_blocks), bound on first use
_new = object.__new__


class DeviceArray:
    """Pointer, shape, element strides, dtype name and device of an array (`obj` keeps it alive).

    Never modified after it is made: `meta` holds what validation may depend on (shape,
    strides, dtype, device and the pointer modulo 16), its part of a `CallArrays` key.
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


def is_torch_tensor(x) -> bool:
    """isinstance(x, torch.Tensor) without importing torch; binds the fast path's type."""
    global _TENSOR, _PARAMETER
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if _TENSOR is None:
        _torch_dtype_name(None)   # fill the dtype table
        _TENSOR, _PARAMETER = torch.Tensor, torch.nn.Parameter
    return isinstance(x, torch.Tensor)


def as_device_array(x, name: str) -> DeviceArray:
    """View `x` (torch, CuPy, JAX, DLPack, CUDA array interface; a DeviceArray is itself) as a
    DeviceArray.

    Raises TypeError naming `name` for host arrays and objects that are not arrays.
    """
    if type(x) is _TENSOR or is_torch_tensor(x):   # a plain tensor costs one type check
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
    if type(x) is DeviceArray:
        return x
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


def _read_torch(objs: tuple) -> tuple[list, tuple] | None:
    """Pointers and key entries of `objs` if each is None or a plain or Parameter torch tensor
    with storage; else None."""
    if _TENSOR is None:
        is_torch_tensor(None)   # binds torch's types once torch is imported
    tensor, parameter = _TENSOR, _PARAMETER
    ptrs, key = [], []
    try:
        for x in objs:
            if x is None:
                ptrs.append(0)
                key.append(None)
            elif type(x) is tensor or type(x) is parameter:
                p = x.data_ptr()
                ptrs.append(p)
                key.append((x.shape, x.stride(), x.dtype, x.device, p & 15))
            else:
                return None
    except RuntimeError:   # a tensor without storage (meta, fake): as_device_array names it
        return None
    return ptrs, tuple(key)


class CallArrays:
    """The array arguments of one call (None for absent ones): each one's pointer and a key of
    what validation may look at, read in one pass. Plain and Parameter CUDA torch tensors, the
    hot path, are read without making DeviceArrays: their key entries are (shape, strides,
    torch dtype, torch device, pointer mod 16). Anything else is viewed with
    `as_device_array` and keyed by `DeviceArray.meta`. The two kinds of key never compare
    equal, so a memo may hold both. `views()` gives the DeviceArrays (for validation); there
    the first `required` arguments may not be None."""
    __slots__ = ("objs", "names", "required", "ptrs", "key", "_views")

    def __init__(self, objs: tuple, names: tuple, required: int):
        self.objs, self.names, self.required, self._views = objs, names, required, None
        read = _read_torch(objs)
        if read is None:
            views = self.views()
            self.ptrs = [0 if a is None else a.ptr for a in views]
            self.key = tuple([None if a is None else a.meta for a in views])
        else:
            self.ptrs, self.key = read

    def views(self) -> list:
        """Each argument as a DeviceArray (an optional None stays None); TypeError names a bad one."""
        if self._views is None:
            self._views = [None if x is None and i >= self.required else as_device_array(x, n)
                           for i, (x, n) in enumerate(zip(self.objs, self.names))]
        return self._views

    def stream(self, stream=None) -> int:
        """The stream handle to launch on, as `launch_stream` with the first argument."""
        if stream is not None:
            return stream_handle(stream)
        if self._views is None:   # torch tensors, read on the hot path
            raw = _RAW_STREAM or _torch_raw_stream()
            return raw(self.objs[0].get_device())
        return launch_stream(self.views()[0])

    def new_contiguous_like(self, i: int) -> tuple[object, int]:
        """A new uninitialized contiguous array with argument i's shape and dtype, on its device,
        in its framework, and its pointer."""
        if self._views is None:
            return _torch_empty_contiguous(self.objs[i])
        ref = self.views()[i]
        if ref.framework == "torch":
            return _torch_empty_contiguous(ref.obj)
        return self.new_empty(i, ref.shape, ref.dtype)

    def new_empty(self, i: int, shape: tuple, dtype: str | None = None) -> tuple[object, int]:
        """A new uninitialized array of `shape` and `dtype` (None: argument i's) on argument i's
        device, in its framework (`empty_like_framework`), and its pointer."""
        if self._views is None:
            obj = _torch_new_empty(self.objs[i], shape, dtype)
            return obj, obj.data_ptr()
        ref = self.views()[i]
        obj = empty_like_framework(ref, shape, dtype or ref.dtype)
        return obj, as_device_array(obj, "out").ptr

    def result(self, arr):
        """`arr`, made by this call, handed back in the framework of the first argument."""
        return arr if self._views is None else to_framework(self.views()[0], arr)


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
        return _torch_new_empty(ref.obj, shape, dtype)
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


def _torch_new_empty(t, shape: tuple, dtype: str | None):
    """A new tensor of `shape` (one size at least) and `dtype` (None: t's) on t's device. The
    sizes go to torch as separate ints and the dtype keyword only when one is asked for: torch
    parses a tuple of sizes ~0.4 µs slower, a dtype ~0.2 µs (a third of an allocation's host time)."""
    if dtype is None:
        return t.new_empty(*shape)
    dt = _TORCH_BY_NAME.get(dtype)
    if dt is None:
        import torch
        dt = _TORCH_BY_NAME[dtype] = getattr(torch, dtype)
    return t.new_empty(*shape, dtype=dt)


class TorchBlock:
    """A block of torch's caching allocator taken for one stream (`torch_scratch`); dropping the
    last reference gives it back (`free`, torch's), for reuse in that stream's order."""
    __slots__ = ("ptr", "free")

    def __del__(self):
        self.free(self.ptr)


def torch_scratch(t, nbytes: int, stream: int) -> tuple[object, int]:
    """`nbytes` of uninitialized memory on torch tensor t's device from torch's caching
    allocator (inside a CUDA-graph capture: the graph's private pool, valid for its replays), and
    its pointer, for kernels on the stream handle `stream`. The allocator reuses a freed block in
    the order of the stream it was taken for. With t's device current, a raw block taken for
    `stream` (`TorchBlock`, no tensor made: ~2 µs less); else a uint8 tensor, recorded on
    `stream` when that is not torch's current one."""
    raw = _RAW_BLOCKS or _torch_raw_blocks()
    dev = t.get_device()
    if raw[0] is not None and raw[0]() == dev:
        block = _new(TorchBlock)
        block.ptr = ptr = raw[1](nbytes, stream)
        block.free = raw[2]
        return block, ptr
    buf = _torch_new_empty(t, (nbytes,), "uint8")
    if stream != (_RAW_STREAM or _torch_raw_stream())(dev):
        import torch
        buf.record_stream(torch.cuda.ExternalStream(stream, device=buf.device))
    return buf, buf.data_ptr()


def _torch_raw_blocks() -> tuple:
    """torch's (current-device getter, raw block alloc(nbytes, stream), free(ptr)) where its CUDA
    build has them, else (None, None, None)."""
    global _RAW_BLOCKS
    c = getattr(sys.modules.get("torch"), "_C", None)
    names = ("_cuda_getDevice", "_cuda_cudaCachingAllocator_raw_alloc", "_cuda_cudaCachingAllocator_raw_delete")
    found = tuple(getattr(c, n, None) for n in names)
    _RAW_BLOCKS = found if None not in found else (None, None, None)
    return _RAW_BLOCKS


def _torch_empty_contiguous(t) -> tuple[object, int]:
    global _EMPTY_LIKE
    if _EMPTY_LIKE is None:
        import torch
        _EMPTY_LIKE = (torch.empty_like, torch.contiguous_format)
    obj = _EMPTY_LIKE[0](t, memory_format=_EMPTY_LIKE[1])
    return obj, obj.data_ptr()


def to_framework(ref: DeviceArray, arr):
    """Hand `arr` (made by empty_like_framework) back in the framework of `ref`."""
    if ref.framework == "torch" or type(ref.obj).__module__.startswith("cupy"):
        return arr
    if type(ref.obj).__module__.startswith("jax"):
        import jax.dlpack
        return jax.dlpack.from_dlpack(arr)
    return arr


def copy_from_host(dst_ptr: int, host, device: int, stream: int) -> None:
    """Copy the bytes of the NumPy array `host` to device memory at `dst_ptr` on `device`, in the
    order of the stream handle `stream`. From pageable memory the driver stages the bytes before
    it returns, so `host` may be dropped at once."""
    import cupy
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.memcpyAsync(dst_ptr, host.ctypes.data, host.nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                                      stream)


def launch_stream(ref: DeviceArray, stream=None) -> int:
    """The stream handle to launch on: `stream` if given (int handle, CuPy or torch stream),
    else torch's current stream for torch arrays, else CuPy's current stream."""
    if stream is not None:
        return stream_handle(stream)
    if ref.framework == "torch":
        raw = _RAW_STREAM or _torch_raw_stream()
        return raw(ref.device)
    import cupy
    return cupy.cuda.get_current_stream(ref.device).ptr


def stream_handle(stream) -> int:
    """The handle of a stream given as an int handle, a CuPy or a torch stream."""
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be an int handle, a CuPy or a torch stream; got {type(stream).__name__}")


def _torch_raw_stream():
    """torch's current-stream getter: its C function where it has one, else the public API."""
    global _RAW_STREAM
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _RAW_STREAM = raw if raw is not None else (lambda device: torch.cuda.current_stream(device).cuda_stream)
    return _RAW_STREAM
