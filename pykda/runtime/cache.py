"""Compiled-kernel cache: in memory per process, on disk across processes.

A disk entry is named by a hash of the rendered source, the compile options, the NVRTC
version, the arch and the entry format; it holds the cubin followed by its SHA-256, is written
to a temporary file and renamed into place (readers never see half a file), and an entry that
fails its checksum is recompiled with a warning.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

from .compile import compile_cubin, compile_options, nvrtc_version
from .render import render
from .spec import KernelSpec

ENV_CACHE_DIR = "PYKDA_CACHE_DIR"
_DIGEST = 32
# 2: whole ELF images (compile.whole_elf); entries of format 1 held CuPy's one-byte-short cubins
ENTRY_FORMAT = 2

_modules: dict[tuple[KernelSpec, int], object] = {}
_locks: dict[object, threading.Lock] = {}
_locks_guard = threading.Lock()
stats = {"nvrtc_compiles": 0, "disk_hits": 0}
_stats_lock = threading.Lock()   # compiles on several threads (compile_specs) count each
# compile_specs' default threads at most (each NVRTC compile holds memory of its own: a many-core host is not
# asked for all its cores' worth)
MAX_JOBS = 8


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "pykda")


def _lock(key) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def entry_path(source: str, arch: str) -> Path:
    h = hashlib.sha256()
    for part in (source, "\0".join(compile_options(arch)), repr(nvrtc_version()), arch, str(ENTRY_FORMAT)):
        h.update(part.encode())
        h.update(b"\0")
    return cache_dir() / f"{h.hexdigest()[:40]}.cubin"


def _read_entry(path: Path) -> bytes | None:
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    cubin, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if len(blob) <= _DIGEST or hashlib.sha256(cubin).digest() != digest:
        warnings.warn(f"pykda: corrupt kernel cache entry {path} is rebuilt", RuntimeWarning, stacklevel=3)
        return None
    return cubin


def _write_entry(path: Path, cubin: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin + hashlib.sha256(cubin).digest())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def compile_spec(spec: KernelSpec) -> tuple[bytes, float, bool]:
    """The spec's cubin from disk, or from NVRTC (then stored). Returns (cubin, seconds, from_disk)."""
    source = render(spec.template, spec.param_dict)
    path = entry_path(source, spec.arch)
    with _lock(path):
        t0 = time.perf_counter()
        cubin = _read_entry(path)
        if cubin is not None:
            _count("disk_hits")
            return cubin, time.perf_counter() - t0, True
        cubin = compile_cubin(source, spec.arch, name=f"{spec.template}.cu")
        _count("nvrtc_compiles")
        _write_entry(path, cubin)
        return cubin, time.perf_counter() - t0, False


def _count(stat: str) -> None:
    with _stats_lock:
        stats[stat] += 1


def default_jobs() -> int:
    """Threads for compile_specs: the CPUs this process may run on, at most MAX_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_JOBS))


def compile_specs(specs: Iterable[KernelSpec], jobs: int | None = None) -> Iterator[tuple[KernelSpec, bytes, float, bool]]:
    """`compile_spec` of every spec on `jobs` threads (None: `default_jobs()`; NVRTC compiles
    without holding the GIL), yielding (spec, cubin, seconds, from_disk) in the specs' order. The
    first failure is raised in that order, and the compiles not yet started are dropped."""
    specs = list(specs)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    if jobs == 1 or len(specs) < 2:
        for spec in specs:
            yield (spec, *compile_spec(spec))
        return
    pool = ThreadPoolExecutor(min(jobs, len(specs)), thread_name_prefix="pykda-nvrtc")
    try:
        futures = [pool.submit(compile_spec, spec) for spec in specs]
        for spec, future in zip(specs, futures):
            yield (spec, *future.result())
    finally:   # (also when the caller stops early)
        pool.shutdown(wait=True, cancel_futures=True)


def _module(spec: KernelSpec, device: int, cubin: bytes | None = None):
    """spec's module on `device`, loaded once (from `cubin` where given, else compile_spec's)."""
    key = (spec, device)
    module = _modules.get(key)
    if module is None:
        with _lock(key):
            module = _modules.get(key)
            if module is None:
                from .launch import load_module
                module = _modules[key] = load_module(compile_spec(spec)[0] if cubin is None else cubin, device)
    return module


def get_kernel(spec: KernelSpec, device: int, name: str):
    """The loaded kernel `name` of `spec` on `device` (compiled and loaded on first use)."""
    return _module(spec, device).kernel(name)


def load_specs(specs: Iterable[KernelSpec], device: int, jobs: int | None = None) -> None:
    """Load every spec's module on `device`, those not loaded yet compiled (or read from disk) on
    `jobs` threads at once (`compile_specs`): the first use of a call of several kernels then
    waits for its slowest compile, not for their sum."""
    missing = [s for s in dict.fromkeys(specs) if (s, device) not in _modules]
    for spec, cubin, _, _ in compile_specs(missing, jobs):
        _module(spec, device, cubin)
