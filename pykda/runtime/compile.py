"""NVRTC compile of a rendered source to a cubin, through CuPy's NVRTC binding (no GPU needed)."""
from __future__ import annotations

import functools
import struct
import threading
from typing import NamedTuple


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries its log."""


BASE_OPTIONS = ("-std=c++17", "--device-as-default-execution-space", "-DNDEBUG", "--fmad=true")


_first_use = threading.Lock()


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's version; its first call loads NVRTC, one thread at a time: loaded by several threads
    at once, NVRTC failed to open its builtins (seen after CuPy's CUDA runtime found no driver)."""
    with _first_use:
        from cupy_backends.cuda.libs import nvrtc
        return tuple(nvrtc.getVersion())


def compile_options(arch: str) -> tuple[str, ...]:
    return BASE_OPTIONS + (f"--gpu-architecture={arch}",)


def compile_cubin(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """Compile CUDA C++ `source` for `arch` (e.g. 'sm_90a') and return the cubin."""
    return _compile(source, arch, name, ())[0]


def ptxas_report(source: str, arch: str, name: str = "kernel.cu") -> str:
    """What ptxas says of `source` compiled for `arch` (`ptxas -v`: registers, spills, and its
    performance notes, such as wgmma serialized: "C7511")."""
    return _compile(source, arch, name, ("--ptxas-options=-v",))[1]


def _compile(source: str, arch: str, name: str, extra: tuple[str, ...]) -> tuple[bytes, str]:
    """(cubin, NVRTC's log) of `source` compiled for `arch` with pykda's options and `extra`."""
    nvrtc_version()   # NVRTC loaded (once, see there) before any thread compiles with it
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(compile_options(arch) + extra))
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {name} for {arch}: {exc}\n{log}") from None
        return whole_elf(nvrtc.getCUBIN(prog), name), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


class KernelResources(NamedTuple):
    """What ptxas gave one kernel of a cubin (`ptxas -v`'s numbers)."""
    registers: int     # per thread
    stack_bytes: int   # per thread: the stack frame (spilled registers, local arrays); 0 when all fit in registers
    static_smem: int   # bytes of static shared memory (sm_90: with the 1 KB the system reserves in a kernel using any)


_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_EIFMT_SVAL = 4                                 # a .nv.info record with a size and a value of that size
_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F   # values: (symbol index, u32)


def _sections(image: bytes) -> list[tuple[str, int, int, int, int]]:
    """The ELF64 image's sections in order: (name, type, offset, size, link)."""
    shoff = struct.unpack_from("<Q", image, 40)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 58)
    headers = [struct.unpack_from("<IIQQQQI", image, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    return [(_c_string(image, names_at + h[0]), h[1], h[4], h[5], h[6]) for h in headers]


def _c_string(image: bytes, at: int) -> str:
    return image[at:image.index(b"\0", at)].decode()


def kernel_resources(cubin: bytes) -> dict[str, KernelResources]:
    """Registers, stack frame and static shared memory of every kernel in `cubin`, by name, read
    from the records ptxas leaves in the ELF (`.nv.info`): what `nvcc -Xptxas -v` prints, for
    cubins NVRTC made."""
    listed = _sections(cubin)
    sections = {name: rest for name, *rest in listed}
    _, _, symtab_at, _, strtab_index = next(s for s in listed if s[1] == _SHT_SYMTAB)
    strtab_at = listed[strtab_index][2]

    def symbol(index: int) -> str:   # Elf64_Sym: st_name first, 24 bytes each
        return _c_string(cubin, strtab_at + struct.unpack_from("<I", cubin, symtab_at + 24 * index)[0])
    values: dict[int, dict[str, int]] = {_EIATTR_REGCOUNT: {}, _EIATTR_FRAME_SIZE: {}}
    _, at, size, _ = sections[".nv.info"]
    end = at + size
    while at < end:   # records: format, attribute, then a u16 (with SVAL: the value's size, the value after it)
        fmt, attr, word = struct.unpack_from("<BBH", cubin, at)
        if fmt == _EIFMT_SVAL:
            if attr in values and word == 8:
                sym, value = struct.unpack_from("<II", cubin, at + 4)
                values[attr][symbol(sym)] = value
            at += 4 + word
        else:
            at += 4
    kernels = [name.removeprefix(".text.") for name in sections if name.startswith(".text.")]
    shared = {name.removeprefix(".nv.shared."): size for name, (_, _, size, _) in sections.items()
              if name.startswith(".nv.shared.")}
    return {k: KernelResources(values[_EIATTR_REGCOUNT][k], values[_EIATTR_FRAME_SIZE].get(k, 0), shared.get(k, 0))
            for k in kernels}


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
    ends += [offset + size for _, kind, offset, size, _ in _sections(image) if kind != _SHT_NOBITS]
    missing = max(ends) - len(image)
    if missing not in (0, 1):
        raise CompileError(f"NVRTC's cubin of {name} is {len(image)} bytes, its ELF headers span {max(ends)}")
    return image + b"\0" * missing
