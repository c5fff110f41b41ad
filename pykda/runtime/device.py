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
    def unsupported(self) -> str | None:
        """Why pykda's kernels cannot run on this device (no KERNEL_TARGETS entry), else None."""
        if self.capability in KERNEL_TARGETS:
            return None
        major, minor = self.capability
        return (f"pykda's kernels run on Hopper GPUs (compute capability 9.0: H100, H200, H800, H20, GH200); "
                f"device {self.index} ({self.name}) has compute capability {major}.{minor}")

    @property
    def arch(self) -> str:
        """The NVRTC target of pykda's kernels on this device (KERNEL_TARGETS); UnsupportedDevice
        naming the device where there is none, before anything is compiled or launched."""
        why = self.unsupported
        if why is not None:
            raise UnsupportedDevice(why)
        return KERNEL_TARGETS[self.capability]


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
