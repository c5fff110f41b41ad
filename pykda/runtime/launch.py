"""Loading cubins through CuPy and launching their kernels with the CUDA driver API.

Kernel parameters are packed into one buffer (cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER),
laid out as the CUDA ABI does: each parameter at its natural alignment, tensor maps at 64
bytes. Python values map to parameter types by their type: `int` -> 64-bit (pointers),
np.int32 -> int, np.int64 -> long long, np.float32 -> float, `bytes` or a 0-d NumPy array
-> a struct passed by value (128 bytes: a tensor map, 64-byte aligned; others 8-byte aligned).
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
_SCALARS = {int: ("Q", 8), np.int64: ("q", 8), np.uint64: ("Q", 8), np.int32: ("i", 4), np.float32: ("f", 4)}


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return launch, name


def _error_name(code: int) -> str:
    s = ctypes.c_char_p()
    _driver()[1](code, ctypes.byref(s))
    return s.value.decode() if s.value else str(code)


@functools.lru_cache(maxsize=1024)
def param_layout(kinds: tuple) -> struct.Struct:
    """The packed parameter buffer for parameter kinds ((type, byte length) per parameter)."""
    fmt, offset = "<", 0
    for typ, length in kinds:
        if typ in _SCALARS:
            code, size = _SCALARS[typ]
            align = size
        elif typ in (bytes, np.ndarray):
            code, size = f"{length}s", length
            align = 64 if length == 128 else 8
        else:
            raise TypeError(f"unsupported kernel argument type {typ.__name__}")
        pad = -offset % align
        fmt += "x" * pad + code
        offset += pad + size
    return struct.Struct(fmt + "x" * (-offset % 8))


def pack_params(args: tuple) -> bytes:
    values = [a.tobytes() if type(a) is np.ndarray else a for a in args]
    kinds = tuple((type(a), len(v) if type(v) is bytes else 0) for a, v in zip(args, values))
    return param_layout(kinds).pack(*values)


class Kernel:
    """One `extern "C"` kernel of a loaded module."""
    __slots__ = ("name", "function", "device", "_smem_limit", "_lock")

    def __init__(self, function, name: str, device: int):
        self.function, self.name, self.device = function, name, device
        self._smem_limit = 48 * 1024
        self._lock = threading.Lock()

    @property
    def num_regs(self) -> int:
        from cupy.cuda import driver
        return driver.funcGetAttribute(_NUM_REGS_ATTR, self.function.ptr)

    def launch(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        if smem > self._smem_limit:
            from cupy.cuda import driver
            with self._lock:
                driver.funcSetAttribute(self.function.ptr, _MAX_DYNAMIC_SMEM_ATTR, smem)
                self._smem_limit = max(self._smem_limit, smem)
        buf = ctypes.create_string_buffer(pack_params(args))
        size = ctypes.c_size_t(len(buf) - 1)
        extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
        launch = _driver()[0]
        call = (self.function.ptr, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, None, extra)
        status = launch(*call)
        if status == _ERROR_INVALID_CONTEXT:   # a thread without a current context: take the device's
            import cupy
            with cupy.cuda.Device(self.device):
                status = launch(*call)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {_error_name(status)} "
                               f"(grid {grid}, block {block}, {smem} bytes of shared memory)")


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
