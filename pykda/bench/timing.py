"""Timing with CUDA events on a cold L2: before every timed call a 1 GiB buffer is
overwritten (about 0.25 ms), which evicts the L2 and keeps the GPU busy while the host
enqueues the call, so host launch overhead stays out of the kernel time. Median of many repeats."""
from __future__ import annotations

import statistics

FLUSH_BYTES = 1 << 30


class Timer:
    def __init__(self):
        import torch
        self.torch = torch
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def median_us(self, fn, warmup: int = 5, repeats: int = 50) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))

    def copy_us(self, nbytes: int, warmup: int = 3, repeats: int = 50) -> float:
        """Median µs of one device-to-device copy of `nbytes` bytes (`nbytes` read and `nbytes`
        written), cold L2: the reference for a kernel that moves the same bytes."""
        torch = self.torch
        a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        return self.median_us(lambda: b.copy_(a), warmup=warmup, repeats=repeats)

    def copy_bandwidth_tbs(self, nbytes: int = 4 << 30) -> float:
        """Device-to-device copy, bytes read + written, TB/s (the memory ceiling)."""
        return 2 * nbytes / self.copy_us(nbytes, warmup=3, repeats=10) / 1e6


def start() -> tuple[Timer, float]:
    """A timer and the measured copy bandwidth (the memory ceiling of the run), printed."""
    timer = Timer()
    copy_tbs = timer.copy_bandwidth_tbs()
    print(f"device-to-device copy: {copy_tbs:.2f} TB/s (read + write)")
    return timer, copy_tbs
