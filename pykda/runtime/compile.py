"""NVRTC compile of a rendered source to a cubin, through CuPy's NVRTC binding (no GPU needed)."""
from __future__ import annotations

import functools


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries its log."""


BASE_OPTIONS = ("-std=c++17", "--device-as-default-execution-space", "-DNDEBUG", "--fmad=true")


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc
    return tuple(nvrtc.getVersion())


def compile_options(arch: str) -> tuple[str, ...]:
    return BASE_OPTIONS + (f"--gpu-architecture={arch}",)


def compile_cubin(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """Compile CUDA C++ `source` for `arch` (e.g. 'sm_90a') and return the cubin."""
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(compile_options(arch)))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {name} for {arch}: {exc}\n{log}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
