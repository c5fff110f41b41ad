"""Stand-ins for device arrays, for CPU tests of argument checks (the pointers are never used)."""
from pykda.runtime.arrays import DeviceArray, contiguous_strides

BASE = 1 << 30   # a 16-byte aligned fake address


def device_array(shape, dtype="bfloat16", strides=None, ptr=BASE, device=0) -> DeviceArray:
    """A DeviceArray of `shape`, contiguous unless `strides` (in elements) are given."""
    if strides is None:
        strides = contiguous_strides(tuple(shape))
    return DeviceArray(ptr, tuple(shape), tuple(strides), dtype, device, "test", None)
