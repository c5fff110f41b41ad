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


def signature(args: tuple) -> tuple:
    """What a parameter buffer's layout depends on: each argument's type, and for a struct
    (`bytes`) its byte length."""
    return tuple(len(a) if type(a) is bytes else type(a) for a in args)


def layout_of(sig: tuple) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed parameter buffer for a signature (types; byte lengths for structs) and each
    parameter's offset in it."""
    fmt, offset, offsets = "<", 0, []
    for t in sig:
        if type(t) is int:   # a struct of t bytes
            code, size = f"{t}s", t
            align = 64 if size == 128 else 8
        elif t in _SCALARS:
            code, size = _SCALARS[t]
            align = size
        else:
            raise TypeError(f"unsupported kernel argument type {t.__name__}")
        pad = -offset % align
        fmt += "x" * pad + code
        offsets.append(offset + pad)
        offset += pad + size
    return struct.Struct(fmt), tuple(offsets)


def param_layout(args: tuple) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed parameter buffer for `args` (laid out by their types and, for structs,
    byte lengths) and each parameter's offset in it."""
    return layout_of(signature(args))


class Launcher:
    """Launches of one kernel with arguments of one signature: the parameter buffer and the
    pointer array into it are made once and reused (the driver copies the parameters during
    cuLaunchKernel). Arguments of another signature would be packed wrongly: an op keeps one
    Launcher per call site, whose argument types never change."""
    __slots__ = ("kernel", "structs", "layout", "buffer", "pointers")

    def __init__(self, kernel: "Kernel", sig: tuple):
        self.kernel = kernel
        self.structs = tuple((i, n) for i, n in enumerate(sig) if type(n) is int)   # (position, bytes)
        self.layout, offsets = layout_of(sig)
        self.buffer = ctypes.create_string_buffer(self.layout.size)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])

    def __call__(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        kernel = self.kernel
        with kernel._lock:
            if smem > kernel._smem_limit:
                from cupy.cuda import driver
                driver.funcSetAttribute(kernel.handle, _MAX_DYNAMIC_SMEM_ATTR, smem)
                kernel._smem_limit = smem
            self.layout.pack_into(self.buffer, 0, *args)
            raw = kernel._raw
            if raw is None:
                raw = kernel._raw = (_driver()[2], ctypes.c_void_p(kernel.handle))
            # The prototype-less entry point costs about half the typed one: the ints go as C ints,
            # the stream as a pointer. Values that are not such (a grid dimension >= 2^31, a stream
            # that is not an int) take the typed entry point, which converts them as before.
            try:
                status = raw[0](raw[1], grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                                ctypes.c_void_p(stream), self.pointers, None)
            except (ctypes.ArgumentError, TypeError):
                status = self._typed(grid, block, smem, stream)
            if status == _ERROR_INVALID_CONTEXT:   # a thread without a current context: take the device's
                import cupy
                with cupy.cuda.Device(kernel.device):
                    status = self._typed(grid, block, smem, stream)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernel({kernel.name}) failed: {_error_name(status)} "
                               f"(grid {grid}, block {block}, {smem} bytes of shared memory)")

    def _typed(self, grid, block, smem, stream) -> int:
        return _driver()[0](self.kernel.handle, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                            stream, self.pointers, None)


class Kernel:
    """One `extern "C"` kernel of a loaded module."""
    __slots__ = ("name", "function", "handle", "device", "_smem_limit", "_lock", "_launchers", "_raw")

    def __init__(self, function, name: str, device: int):
        self.function, self.name, self.device = function, name, device
        self.handle = function.ptr
        self._smem_limit = 48 * 1024
        self._lock = threading.Lock()
        self._launchers: dict[tuple, Launcher] = {}   # by signature, and by the argument types alone
        self._raw = None   # (cuLaunchKernel without argtypes, the kernel handle as c_void_p)

    @property
    def num_regs(self) -> int:
        from cupy.cuda import driver
        return driver.funcGetAttribute(_NUM_REGS_ATTR, self.handle)

    def launcher(self, args: tuple) -> Launcher:
        """The Launcher for arguments like `args` (looked up by their types alone; struct
        lengths are checked against the one found)."""
        types = tuple(map(type, args))
        found = self._launchers.get(types)
        if found is not None:
            for i, n in found.structs:
                if len(args[i]) != n:
                    break
            else:
                return found
        found = self._launchers[types] = self.launcher_for(signature(args))
        return found

    def launcher_for(self, sig: tuple) -> Launcher:
        """The Launcher for arguments of signature `sig` (see `signature`), made on first use."""
        found = self._launchers.get(sig)
        if found is None:
            found = self._launchers[sig] = Launcher(self, sig)
        return found

    def launch(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        self.launcher(args)(grid, block, args, smem, stream)


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
