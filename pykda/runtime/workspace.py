"""Scratch memory for one call's launches, from the allocator of the caller's framework.

- torch tensors: torch's caching allocator. Inside a CUDA-graph capture it hands out memory of
  the graph's private pool (which stays valid for the graph's replays), so a capture never
  calls cudaMalloc, whatever the stream.
- CuPy arrays: CuPy's current allocator (its memory pool unless the caller set another), with
  the launch stream current, since the pool reuses a freed block in that stream's order.
- anything else (JAX, other DLPack producers), whose allocator Python cannot reach: a buffer
  pykda owns, one per (device, stream), grown as needed.

The caller holds the returned owner until its launches are enqueued; afterwards the memory may
go back to its pool, which reuses it only after the work queued on the stream. Nothing is
carried from one call to the next: the memory holds whatever its last user left, and a call's
launches write every byte of it that they read.
"""
from __future__ import annotations

from .arrays import as_device_array, is_torch_tensor, torch_scratch

_owned: dict[tuple[int, int], object] = {}   # (device, stream) -> cupy.cuda.Memory, the fallback


def workspace(ref, stream: int, nbytes: int) -> tuple[object, int]:
    """(owner, pointer) of `nbytes` of scratch on the device of array `ref` (an argument of the
    call, as given or as a DeviceArray), taken from ref's framework, for kernels on the stream
    handle `stream`; its contents are undefined. Keep `owner` alive until the launches that use
    the memory are enqueued."""
    if nbytes < 1:
        raise ValueError(f"workspace: nbytes must be positive; got nbytes={nbytes}")
    if is_torch_tensor(ref):   # the hot path: an argument as the caller gave it
        owner, ptr = torch_scratch(ref, nbytes, stream)
    else:
        a = as_device_array(ref, "ref")
        if a.framework == "torch":
            owner, ptr = torch_scratch(a.obj, nbytes, stream)
        elif type(a.obj).__module__.startswith("cupy"):
            owner, ptr = _cupy_scratch(a.device, stream, nbytes)
        else:
            owner, ptr = _owned_scratch(a.device, stream, nbytes)
    return owner, ptr


def _cupy_scratch(device: int, stream: int, nbytes: int) -> tuple[object, int]:
    """A block of CuPy's current allocator, taken with `stream` current."""
    import cupy
    with cupy.cuda.Device(device):
        if cupy.cuda.get_current_stream().ptr == stream:
            mem = cupy.cuda.alloc(nbytes)
        else:
            with cupy.cuda.ExternalStream(stream):
                mem = cupy.cuda.alloc(nbytes)
    return mem, mem.ptr


def _owned_scratch(device: int, stream: int, nbytes: int) -> tuple[object, int]:
    """The (device, stream) buffer, reallocated larger (doubling, 1 MiB at least) when too small.
    Used in stream order only; a replaced buffer is freed by cudaFree, which waits for the
    device."""
    key = (device, stream)
    buf = _owned.get(key)
    if buf is None or buf.size < nbytes:
        import cupy
        with cupy.cuda.Device(device):
            buf = _owned[key] = cupy.cuda.Memory(max(nbytes, 2 * buf.size if buf is not None else 0, 1 << 20))
    return buf, buf.ptr
