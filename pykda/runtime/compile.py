"""NVRTC compile of a rendered source to a cubin, through CuPy's NVRTC binding (no GPU needed)."""
from __future__ import annotations

import functools
import struct


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
        return whole_elf(nvrtc.getCUBIN(prog), name)
    finally:
        nvrtc.destroyProgram(prog)


def whole_elf(image: bytes, name: str = "kernel.cu") -> bytes:
    """`image` as long as its ELF64 headers say: its header tables, sections and segments.

    CuPy's getCUBIN returns one byte less than NVRTC's cubin (it strips a trailing NUL, as for PTX).
    The byte is the high byte of the last header table's last field, always 0, so it is put back:
    the driver would otherwise read one byte past the buffer, and cuobjdump and nvdisasm reject the
    short file."""
    phoff, shoff = struct.unpack_from("<QQ", image, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 54)
    ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
    for i in range(phnum):   # segments: p_offset, p_filesz
        at = phoff + i * phentsize
        ends.append(struct.unpack_from("<Q", image, at + 8)[0] + struct.unpack_from("<Q", image, at + 32)[0])
    for i in range(shnum):   # sections but SHT_NOBITS: sh_offset, sh_size
        at = shoff + i * shentsize
        if struct.unpack_from("<I", image, at + 4)[0] != 8:
            ends.append(struct.unpack_from("<Q", image, at + 24)[0] + struct.unpack_from("<Q", image, at + 32)[0])
    missing = max(ends) - len(image)
    if missing not in (0, 1):
        raise CompileError(f"NVRTC's cubin of {name} is {len(image)} bytes, its ELF headers span {max(ends)}")
    return image + b"\0" * missing
