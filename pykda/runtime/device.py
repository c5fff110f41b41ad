"""Facts about the GPU a kernel runs on, read once per device."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    capability: tuple[int, int]
    sm_count: int
    smem_per_block_optin: int
    smem_per_sm: int
    l2_bytes: int

    @property
    def arch(self) -> str:
        """NVRTC target: Hopper gets sm_90a (wgmma, setmaxnreg), others their plain arch."""
        major, minor = self.capability
        return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def require_gpu() -> None:
    if not gpu_available():
        raise RuntimeError("pykda: no CUDA GPU is available (CuPy sees no device or no driver); "
                           "kernels can still be compiled offline with `python -m pykda compile`")


@functools.lru_cache(maxsize=None)
def device_info(index: int) -> DeviceInfo:
    require_gpu()
    import cupy
    p = cupy.cuda.runtime.getDeviceProperties(index)
    return DeviceInfo(
        index=index,
        name=p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"]),
        capability=(int(p["major"]), int(p["minor"])),
        sm_count=int(p["multiProcessorCount"]),
        smem_per_block_optin=int(p["sharedMemPerBlockOptin"]),
        smem_per_sm=int(p["sharedMemPerMultiprocessor"]),
        l2_bytes=int(p["l2CacheSize"]),
    )
