"""Facts about the GPU a kernel runs on, read once per device."""
from __future__ import annotations

import functools
from dataclasses import dataclass


# The compute capabilities pykda's kernels are written for, and each one's NVRTC target: Hopper's
# sm_90a (TMA tensor copies, mbarriers with transaction counts, clusters, wgmma, setmaxnreg). On
# other GPUs some templates would not compile and the rest would run untested.
KERNEL_TARGETS = {(9, 0): "sm_90a"}


class UnsupportedDevice(ValueError):
    """A GPU pykda's kernels are not written for (KERNEL_TARGETS)."""


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
        """The NVRTC target of pykda's kernels on this device (KERNEL_TARGETS); UnsupportedDevice
        naming the device where there is none, before anything is compiled or launched."""
        target = KERNEL_TARGETS.get(self.capability)
        if target is None:
            major, minor = self.capability
            raise UnsupportedDevice(f"pykda's kernels run on Hopper GPUs (compute capability 9.0: H100, H200, H800, "
                                    f"H20, GH200); device {self.index} ({self.name}) has compute capability "
                                    f"{major}.{minor}")
        return target


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
