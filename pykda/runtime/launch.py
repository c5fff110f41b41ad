"""Loading cubins through CuPy and launching their kernels on a given stream."""
from __future__ import annotations

_MAX_DYNAMIC_SMEM_ATTR = 8   # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_NUM_REGS_ATTR = 4           # CU_FUNC_ATTRIBUTE_NUM_REGS


class _Stream:
    """What CuPy's launcher reads of a stream: its handle."""
    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


_streams: dict[int, _Stream] = {}


def stream_handle(ptr: int) -> _Stream:
    s = _streams.get(ptr)
    if s is None:
        s = _streams[ptr] = _Stream(ptr)
    return s


class Kernel:
    """One `extern "C"` kernel of a loaded module."""
    __slots__ = ("name", "function", "device", "_smem_limit")

    def __init__(self, function, name: str, device: int):
        self.function, self.name, self.device = function, name, device
        self._smem_limit = 48 * 1024

    @property
    def num_regs(self) -> int:
        from cupy.cuda import driver
        return driver.funcGetAttribute(_NUM_REGS_ATTR, self.function.ptr)

    def launch(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        if smem > self._smem_limit:
            from cupy.cuda import driver
            driver.funcSetAttribute(self.function.ptr, _MAX_DYNAMIC_SMEM_ATTR, smem)
            self._smem_limit = smem
        self.function(grid, block, args, shared_mem=smem, stream=stream_handle(stream))


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
