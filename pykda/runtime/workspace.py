"""Scratch memory for kernels: one growing buffer per (device, stream), reused across calls.

Steady state allocates nothing, so calls can be captured in a CUDA graph once a warm-up call
has grown the buffer. The buffer is handed out whole; a call that needs several regions
carves them itself.
"""
from __future__ import annotations

_buffers: dict[tuple[int, int, bool], object] = {}


def workspace(device: int, stream: int, nbytes: int, zeroed: bool = False) -> int:
    """Device pointer to at least `nbytes` of scratch for kernels on (`device`, `stream`).

    `zeroed=True` gives a second buffer, never shared with the scratch: zero-filled on `stream`
    when (re)allocated, and every kernel that uses it must leave it zeroed (ticket counters)."""
    key = (device, stream, zeroed)
    buf = _buffers.get(key)
    if buf is None or buf.mem.size < nbytes:
        import cupy
        with cupy.cuda.Device(device):
            # grow geometrically so that slowly rising sizes do not reallocate every call
            size = max(nbytes, 2 * buf.mem.size if buf is not None else 0, 1 << 20)
            buf = _buffers[key] = cupy.cuda.alloc(size)
            if zeroed:
                cupy.cuda.runtime.memsetAsync(buf.ptr, 0, size, stream)
    return buf.ptr
