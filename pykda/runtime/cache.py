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
from pathlib import Path

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
            stats["disk_hits"] += 1
            return cubin, time.perf_counter() - t0, True
        cubin = compile_cubin(source, spec.arch, name=f"{spec.template}.cu")
        stats["nvrtc_compiles"] += 1
        _write_entry(path, cubin)
        return cubin, time.perf_counter() - t0, False


def get_kernel(spec: KernelSpec, device: int, name: str):
    """The loaded kernel `name` of `spec` on `device` (compiled and loaded on first use)."""
    key = (spec, device)
    module = _modules.get(key)
    if module is None:
        with _lock(key):
            module = _modules.get(key)
            if module is None:
                from .launch import load_module
                cubin, _, _ = compile_spec(spec)
                module = _modules[key] = load_module(cubin, device)
    return module.kernel(name)
