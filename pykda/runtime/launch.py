"""Loading cubins through CuPy and launching their kernels with the CUDA driver API.

Kernel parameters are packed into one buffer laid out as the CUDA ABI does (each parameter
at its natural alignment, tensor maps at 64 bytes); cuLaunchKernel gets a pointer to each. Python values map to parameter types by their type: `int` -> 64-bit (pointers),
np.int32 -> int, np.int64 -> long long, np.float32 and `float` -> float (rounded to nearest),
`bytes` -> a struct passed by value (128 bytes: a tensor map, 64-byte aligned; others 8-byte
aligned).
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading

import numpy as np

_MAX_DYNAMIC_SMEM_ATTR = 8   # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_NUM_REGS_ATTR = 4           # CU_FUNC_ATTRIBUTE_NUM_REGS
_ERROR_INVALID_CONTEXT = 201
_SCALARS = {int: ("Q", 8), np.int64: ("q", 8), np.uint64: ("Q", 8), np.int32: ("i", 4), np.float32: ("f", 4),
            float: ("f", 4)}


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    raw = ctypes.CDLL("libcuda.so.1").cuLaunchKernel   # its own function object: no argtypes
    raw.restype = ctypes.c_int
    return launch, name, raw


def _error_name(code: int) -> str:
    s = ctypes.c_char_p()
    _driver()[1](code, ctypes.byref(s))
    return s.value.decode() if s.value else str(code)


def param_layout(args: tuple) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed parameter buffer for `args` (laid out by their types and, for structs,
    byte lengths) and each parameter's offset in it."""
    fmt, offset, offsets = "<", 0, []
    for a in args:
        typ = type(a)
        if typ in _SCALARS:
            code, size = _SCALARS[typ]
            align = size
        elif typ is bytes:
            code, size = f"{len(a)}s", len(a)
            align = 64 if size == 128 else 8
        else:
            raise TypeError(f"unsupported kernel argument type {typ.__name__}")
        pad = -offset % align
        fmt += "x" * pad + code
        offsets.append(offset + pad)
        offset += pad + size
    return struct.Struct(fmt), tuple(offsets)


class _ParamBuffer:
    """A kernel's parameter buffer and the pointer array into it, reused across launches
    (the driver copies the parameters during cuLaunchKernel). `struct_sizes` pairs the
    position of each struct argument with its byte length (part of the layout)."""
    __slots__ = ("layout", "buffer", "pointers", "struct_sizes")

    def __init__(self, args: tuple):
        self.layout, offsets = param_layout(args)
        self.buffer = ctypes.create_string_buffer(self.layout.size)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])
        self.struct_sizes = tuple((i, len(a)) for i, a in enumerate(args) if type(a) is bytes)


def _layout_key(args: tuple) -> tuple:
    """What the parameter layout depends on: each argument's type, and each struct's length."""
    return tuple(len(a) if type(a) is bytes else type(a) for a in args)


class Kernel:
    """One `extern "C"` kernel of a loaded module."""
    __slots__ = ("name", "function", "handle", "device", "_smem_limit", "_lock", "_params", "_raw")

    def __init__(self, function, name: str, device: int):
        self.function, self.name, self.device = function, name, device
        self.handle = function.ptr
        self._smem_limit = 48 * 1024
        self._lock = threading.Lock()
        self._params: dict[tuple, _ParamBuffer] = {}
        self._raw = None   # (cuLaunchKernel without argtypes, the kernel handle as c_void_p)

    @property
    def num_regs(self) -> int:
        from cupy.cuda import driver
        return driver.funcGetAttribute(_NUM_REGS_ATTR, self.handle)

    def _params_for(self, args: tuple) -> _ParamBuffer:
        """The parameter buffer for these argument types (looked up by types alone; struct
        lengths are checked against the buffer found)."""
        types = tuple(map(type, args))
        params = self._params.get(types)
        if params is not None:
            for i, size in params.struct_sizes:
                if len(args[i]) != size:
                    break
            else:
                return params
        key = _layout_key(args)
        params = self._params.get(key)
        if params is None:
            params = self._params[key] = _ParamBuffer(args)
        if types not in self._params:
            self._params[types] = params
        return params

    def launch(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        with self._lock:
            if smem > self._smem_limit:
                from cupy.cuda import driver
                driver.funcSetAttribute(self.handle, _MAX_DYNAMIC_SMEM_ATTR, smem)
                self._smem_limit = smem
            params = self._params_for(args)
            params.layout.pack_into(params.buffer, 0, *args)
            raw = self._raw
            if raw is None:
                raw = self._raw = (_driver()[2], ctypes.c_void_p(self.handle))
            # The prototype-less entry point costs about half the typed one: the ints go as C ints,
            # the stream as a pointer. Values that are not such (a grid dimension >= 2^31, a stream
            # that is not an int) take the typed entry point, which converts them as before.
            try:
                status = raw[0](raw[1], grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                                ctypes.c_void_p(stream), params.pointers, None)
            except (ctypes.ArgumentError, TypeError):
                status = self._typed_launch(grid, block, smem, stream, params)
            if status == _ERROR_INVALID_CONTEXT:   # a thread without a current context: take the device's
                import cupy
                with cupy.cuda.Device(self.device):
                    status = self._typed_launch(grid, block, smem, stream, params)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {_error_name(status)} "
                               f"(grid {grid}, block {block}, {smem} bytes of shared memory)")

    def _typed_launch(self, grid, block, smem, stream, params) -> int:
        return _driver()[0](self.handle, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream,
                            params.pointers, None)


class LoadedModule:
    __slots__ = ("module", "device", "_kernels")

    def __init__(self, module, device: int):
        self.module, self.device, self._kernels = module, device, {}

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = Kernel(self.module.get_function(name), name, self.device)
        return k


def load_module(cubin: bytes, device: int) -> LoadedModule:
    import cupy
    from cupy.cuda import function
    with cupy.cuda.Device(device):
        module = function.Module()
        module.load(cubin)
    return LoadedModule(module, device)
