"""Timing with CUDA events on a cold L2, median of many repeats.

Before every timed call the L2 is evicted by streaming a 1 GiB buffer (about 0.25 ms), which
also keeps the GPU busy while the host enqueues the call, so host launch overhead stays out of
the kernel time. How the buffer is streamed matters:

- ``read`` (default): a reduction reads it, so the L2 is left holding clean lines. The timed
  call starts as a kernel does in a model, after kernels that mostly read (weights).
- ``write``: the buffer is overwritten, so the L2 is left full of dirty lines (up to its 60 MB),
  and the timed call pays for writing them back as it evicts them (up to 14 µs of HBM time,
  6–9 µs measured on a 134 MB decode). Kept to compare with numbers measured that way.
"""
from __future__ import annotations

import statistics
import time

FLUSH_BYTES = 1 << 30
FLUSH_MODES = ("read", "write")
_deadline: float | None = None   # time.monotonic() past which a bench takes no more shapes (--max-seconds)


def set_max_seconds(seconds: float | None) -> None:
    """`--max-seconds`: from now, a bench's outer loops (`in_time`) take new shapes for at most
    `seconds` (None: no limit)."""
    global _deadline
    _deadline = None if seconds is None else time.monotonic() + seconds


def in_time(items, unit: str = "shapes") -> "_InTime":
    """The items of a bench's outer loop (a shape each), taken while `--max-seconds` lasts: once it
    is spent the loop ends, with a line saying how far it got, and the bench prints and writes the
    rows it measured (a device call's time limit then still leaves a table)."""
    return _InTime(list(items), unit)


class _InTime:
    """in_time's iterable; it has a length, for the progress bar."""

    def __init__(self, items: list, unit: str):
        self.items, self.unit = items, unit

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        for i, item in enumerate(self.items):
            if _deadline is not None and time.monotonic() >= _deadline:
                print(f"--max-seconds spent: stopped after {i} of {len(self.items)} {self.unit}", flush=True)
                return
            yield item


class Timer:
    def __init__(self, flush: str = "read"):
        import torch
        if flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}; got {flush!r}")
        self.torch = torch
        buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.flush = buf.sum if flush == "read" else buf.zero_

    def median_us(self, fn, warmup: int = 5, repeats: int = 50) -> float:
        torch = self.torch
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for s, e in zip(starts, ends):
            self.flush()
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


def start(flush: str = "read") -> tuple[Timer, float]:
    """A timer and the measured copy bandwidth (the memory ceiling of the run), printed."""
    timer = Timer(flush)
    copy_tbs = timer.copy_bandwidth_tbs()
    print(f"device-to-device copy: {copy_tbs:.2f} TB/s (read + write); L2 flushed by {flush}")
    return timer, copy_tbs


def host_us(fn, n=300) -> float:
    """Host µs per call of `fn`: the time a call takes to return with the GPU idle when it is
    made (synchronized before each call, outside the timing), the median of `n` calls after a
    warm-up. (A tight loop of calls would time the GPU wherever the kernels outlast the host's
    work: the launch queue fills and the host waits.)"""
    import torch
    fn()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


BUSY_SLEEP_CYCLES = 20_000_000   # the GPU sleep a burst of busy_host_us starts behind (~10 ms), grown where too short


def busy_host_us(fn, n=100, bursts=7) -> float:
    """Host µs per call of `fn` made back to back while the GPU is busy, as a serving loop makes
    its calls while the GPU still runs earlier work: each burst of `n` calls is enqueued behind a
    GPU sleep (torch.cuda._sleep) that outlasts it, so its kernels queue and the host never waits
    on them; the median of `bursts` bursts' mean. (host_us's calls find the GPU idle: a launch
    then costs the host more.) A burst that the sleep did not outlast is made again behind a
    sleep four times as long."""
    import torch
    fn()
    torch.cuda.synchronize()
    cycles, means = BUSY_SLEEP_CYCLES, []
    while len(means) < bursts:
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        mean = (time.perf_counter() - t0) / n
        outlasted = not torch.cuda.current_stream().query()   # the sleep still runs: nothing waited on it
        torch.cuda.synchronize()
        if outlasted:
            means.append(mean)
        elif cycles >= 256 * BUSY_SLEEP_CYCLES:
            raise RuntimeError("busy_host_us: a burst of calls outlasted every GPU sleep tried; fewer calls (n)?")
        else:
            cycles *= 4
    return statistics.median(means) * 1e6


def graph_host_us(fn, n=300) -> float:
    """Host µs per replay of a CUDA graph that holds one call of `fn` (captured after a warm-up)."""
    import torch
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return host_us(graph.replay, n)
    finally:
        del graph
