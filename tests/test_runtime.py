"""CPU tests of the JIT runtime: render, offline compile, disk cache, tensor-map checks."""
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from pykda import registry, runtime
from pykda.runtime import cache, launch

ROOT = Path(__file__).resolve().parent.parent


def _decode_spec():
    return registry.specs("decode", "sm_90a")[0]


def test_render_inlines_headers_once_and_is_self_contained():
    spec = _decode_spec()
    src = runtime.render(spec.template, spec.param_dict)
    assert "#include \"" not in src
    assert src.count("---- common.cuh ----") == 1
    assert "decode_partial" in src and "decode_merge" in src


@pytest.mark.parametrize("value, built_for_it", [("1", True), ("0", False), ("", False)])
def test_a_sanitizer_build_is_a_source_of_its_own(monkeypatch, value, built_for_it):
    """PYKDA_SANITIZE puts `#define PYKDA_SANITIZE 1` first (so its own cache entry); the racecheck
    build of kda_recurrence (every consumer thread hands a stage back) compiles."""
    spec = next(s for s in registry.specs("kda", "sm_90a") if s.template == "kda_recurrence")
    monkeypatch.delenv("PYKDA_SANITIZE", raising=False)
    plain = runtime.render(spec.template, spec.param_dict)
    monkeypatch.setenv("PYKDA_SANITIZE", value)
    src = runtime.render(spec.template, spec.param_dict)
    assert (src == "#define PYKDA_SANITIZE 1\n" + plain) if built_for_it else src == plain
    if built_for_it:
        runtime.compile_cubin(src, "sm_90a")


def test_render_rejects_unknown_template_and_missing_parameter():
    with pytest.raises(ValueError, match="unknown kernel template"):
        runtime.render("no_such_kernel", {})
    params = _decode_spec().param_dict
    del params["STAGES"]
    with pytest.raises(ValueError, match="'STAGES' is undefined"):
        runtime.render("decode", params)


def test_compile_error_carries_the_nvrtc_log():
    with pytest.raises(runtime.CompileError, match="undefined_thing"):
        runtime.compile_cubin('extern "C" __global__ void k() { undefined_thing(); }', "sm_90a")


def test_cubin_is_the_whole_elf_image():
    """CuPy's getCUBIN drops the cubin's last byte; compile_cubin puts it back (tools read the file)."""
    from pykda.runtime.compile import whole_elf
    cubin = runtime.compile_cubin('extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.f; }', "sm_90a")
    assert cubin[:4] == b"\x7fELF" and whole_elf(cubin) == cubin
    assert whole_elf(cubin[:-1]) == cubin and cubin[-1] == 0
    with pytest.raises(runtime.CompileError, match="ELF headers span"):
        whole_elf(cubin[:-2])


def test_kernel_resources_are_what_ptxas_gave_each_kernel():
    """runtime.kernel_resources reads each kernel's registers, stack frame and static shared
    memory from the cubin: a kernel held to 32 registers around a 64-float array indexed at run
    time has a stack frame; one beside it in the same cubin has none, and its static array shows."""
    src = r"""
    extern "C" __global__ void __maxnreg__(32) spills(float* x, int n) {
      float a[64];
    #pragma unroll
      for (int i = 0; i < 64; ++i) a[i] = x[i * n + threadIdx.x];
      float s = 0.f;
    #pragma unroll
      for (int i = 0; i < 64; ++i) s += a[i] * a[63 - i] * x[i];
      x[threadIdx.x] = s + a[n & 63];
    }
    extern "C" __global__ void fits(float* x) {
      __shared__ float tile[96];
      tile[threadIdx.x % 96] = x[threadIdx.x];
      __syncthreads();
      x[threadIdx.x] = tile[(threadIdx.x + 1) % 96];
    }"""
    res = runtime.kernel_resources(runtime.compile_cubin(src, "sm_90a"))
    assert set(res) == {"spills", "fits"}
    assert res["spills"].registers == 32 and res["spills"].stack_bytes >= 4 * 32 and res["spills"].static_smem == 0
    assert 0 < res["fits"].registers < 32 and res["fits"].stack_bytes == 0
    assert res["fits"].static_smem in (96 * 4, 96 * 4 + 1024)   # (+ the 1 KB sm_90 reserves where smem is used)


def test_disk_cache_second_compile_skips_nvrtc(cache_dir):
    spec = _decode_spec()
    before = cache.stats["nvrtc_compiles"]
    cubin1, _, from_disk1 = runtime.compile_spec(spec)
    assert not from_disk1 and cache.stats["nvrtc_compiles"] == before + 1
    cubin2, _, from_disk2 = runtime.compile_spec(spec)
    assert from_disk2 and cubin2 == cubin1 and cache.stats["nvrtc_compiles"] == before + 1
    assert len(list(cache_dir.glob("*.cubin"))) == 1
    assert cubin1[:4] == b"\x7fELF"


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupt_cache_entry_is_rebuilt_with_a_warning(cache_dir, damage):
    spec = _decode_spec()
    good, _, _ = runtime.compile_spec(spec)
    (path,) = cache_dir.glob("*.cubin")
    blob = path.read_bytes()
    path.write_bytes({"truncate": blob[: len(blob) // 2], "flip": blob[:100] + bytes([blob[100] ^ 1]) + blob[101:],
                      "empty": b""}[damage])
    with pytest.warns(RuntimeWarning, match="corrupt kernel cache entry"):
        cubin, _, from_disk = runtime.compile_spec(spec)
    assert not from_disk and cubin == good
    assert runtime.compile_spec(spec)[2]   # rewritten entry is good again


def test_concurrent_requests_compile_once(cache_dir):
    spec = _decode_spec()
    before = cache.stats["nvrtc_compiles"]
    results = []
    threads = [threading.Thread(target=lambda: results.append(runtime.compile_spec(spec)[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and cache.stats["nvrtc_compiles"] == before + 1


def test_compile_specs_on_threads_yields_in_order_and_compiles_each_once(cache_dir):
    """`runtime.compile_specs`: the specs' cubins in their order, each source through NVRTC once
    (a repeated spec and a second pass come from the disk cache)."""
    specs = registry.specs("decode", "sm_90a")[:4]
    before = cache.stats["nvrtc_compiles"]
    first = list(runtime.compile_specs(specs, jobs=3))
    assert [row[0] for row in first] == specs and not any(row[3] for row in first)
    assert cache.stats["nvrtc_compiles"] == before + 4
    assert all(row[1] == runtime.compile_spec(spec)[0] for row, spec in zip(first, specs))
    again = list(runtime.compile_specs(specs + specs[:1], jobs=2))
    assert [row[1] for row in again] == [row[1] for row in first] + [first[0][1]] and all(row[3] for row in again)
    assert cache.stats["nvrtc_compiles"] == before + 4


def test_load_specs_compiles_the_missing_at_once_and_loads_each_once(monkeypatch, cache_dir):
    """`runtime.load_specs` (a call's kernels before their first use): the specs not loaded on the
    device are compiled on threads at the same time (the compiles overlap), each module is loaded
    once, on the caller's thread, and get_kernel then finds them without compiling; specs loaded
    already (or on another device, or repeated) compile nothing more."""
    in_flight, overlap, loads = [0], [0], []
    lock = threading.Lock()

    def slow_compile(spec):
        with lock:
            in_flight[0] += 1
            overlap[0] = max(overlap[0], in_flight[0])
        time.sleep(0.2)
        with lock:
            in_flight[0] -= 1
        return b"cubin " + spec.template.encode(), 0.2, False

    class Module:
        def __init__(self, cubin, device):
            loads.append((cubin, device, threading.current_thread() is threading.main_thread()))

        def kernel(self, name):
            return name
    monkeypatch.setattr(cache, "compile_spec", slow_compile)
    monkeypatch.setattr(launch, "load_module", Module)
    specs = [runtime.KernelSpec.make(t, {"N": i}) for i, t in enumerate(("a", "b", "c"))]
    runtime.load_specs(specs + specs[:1], 0, jobs=3)
    assert overlap[0] == 3 and sorted(c for c, _, _ in loads) == [b"cubin a", b"cubin b", b"cubin c"]
    assert all(main and dev == 0 for _, dev, main in loads)
    assert runtime.get_kernel(specs[1], 0, "k") == "k" and len(loads) == 3
    runtime.load_specs(specs, 0, jobs=3)
    assert len(loads) == 3
    runtime.load_specs(specs[:1], 1)
    assert loads[-1] == (b"cubin a", 1, True) and len(loads) == 4


def test_compile_specs_raises_the_first_failure_in_order_and_drops_the_rest(monkeypatch):
    """A failing compile is raised where its spec comes (the ones before it are yielded), and the
    compiles not yet started are not run; jobs below 1 are refused."""
    started = []

    def fake_compile(spec):
        started.append(spec)
        time.sleep(0.05)
        if spec == 2:
            raise runtime.CompileError("spec 2 does not compile")
        return b"cubin %d" % spec, 0.05, False
    monkeypatch.setattr(cache, "compile_spec", fake_compile)
    results = runtime.compile_specs(range(100), jobs=2)
    assert [next(results)[:2] for _ in range(2)] == [(0, b"cubin 0"), (1, b"cubin 1")]
    with pytest.raises(runtime.CompileError, match="spec 2"):
        next(results)
    assert len(started) < 10
    with pytest.raises(ValueError, match="jobs must be at least 1; got 0"):
        next(runtime.compile_specs(range(3), jobs=0))


def test_nvrtc_on_threads_in_fresh_processes_after_the_gpu_check():
    """Processes whose first NVRTC compiles run on four threads at once (as compile_specs' or
    several callers' get_kernel), after gpu_available() (which without a driver leaves CuPy's CUDA
    runtime failed, as the tests' conftest does): every kernel compiles. Without NVRTC's first load
    serialized (`nvrtc_version`), most such processes failed (NVRTC could not open its builtins),
    so five run."""
    code = ("from concurrent.futures import ThreadPoolExecutor; from pykda import registry, runtime;"
            "runtime.gpu_available();"
            "specs = [s for s in registry.specs('kda', 'sm_90a') if s.template == 'kda_scan'][:4];"
            "sources = [runtime.render(s.template, s.param_dict) for s in specs];"
            "pool = ThreadPoolExecutor(4);"
            "print(sum(c[:4] == b'\\x7fELF' for c in pool.map(lambda s: runtime.compile_cubin(s, 'sm_90a'), sources)))")
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True,
                             env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}) for _ in range(5)]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0 and out.strip() == "4", err[-2000:]


def test_second_process_pays_no_nvrtc_time(cache_dir):
    code = ("from pykda import registry, runtime; from pykda.runtime import cache;"
            "runtime.compile_spec(registry.specs('decode', 'sm_90a')[0]);"
            "print(cache.stats['nvrtc_compiles'])")
    env = {**__import__("os").environ, "PYKDA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["1", "0"]


def test_cache_key_depends_on_source_and_arch(cache_dir):
    a = cache.entry_path("x", "sm_90a")
    assert a != cache.entry_path("y", "sm_90a") and a != cache.entry_path("x", "sm_80")
    assert a.parent == cache_dir


def test_compile_cli_prints_one_line_per_kernel(cache_dir):
    env = {**__import__("os").environ, "PYKDA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pykda", "compile", "--family", "kda"], env=env,
                       capture_output=True, text=True, check=True)
    *lines, summary = r.stdout.strip().splitlines()
    n = len(registry.specs("kda", "sm_90a"))
    assert len(lines) == n and summary.startswith(f"{n} specializations ({n} by NVRTC, 0 from the disk cache) in ")
    assert all(" s " in line and " B " in line and line.startswith("kda_") and " regs" in line for line in lines)


def test_render_cli_prints_source():
    args = [sys.executable, "-m", "pykda", "render", "decode", "D=128", "DTYPE=bf16_t", "BLOCK_N=64", "STAGES=3",
            "WARPS=4", "TRANSPOSED=True", "SPLIT=True"]
    r = subprocess.run(args + ["MERGE_THREADS=256", "MERGE_COLUMNS=32"], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    assert "constexpr int D = 128;" in r.stdout and "int chunk_rows," in r.stdout, "the chunk is an argument"
    assert "CHUNK" not in r.stdout
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)   # the merge's shape left out
    assert r.returncode == 2 and r.stdout == ""
    assert "'MERGE_THREADS' is undefined" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_demo_without_gpu_shows_offline_compile(cache_dir):
    if runtime.gpu_available():
        pytest.skip("this machine has a GPU: the demo runs for real")
    env = {**__import__("os").environ, "PYKDA_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pykda", "demo"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU" in r.stdout and "compiled" in r.stdout and " B (NVRTC)" in r.stdout
    for family in ("kda_prepare", "kda_recurrence", "kda_decode", "decode"):
        assert f"\n  {family} " in r.stdout, family


def test_no_gpu_call_raises_runtime_error():
    if runtime.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        runtime.require_gpu()


# ---- tensor maps ----
GOOD = dict(name="k", dtype="bfloat16", ptr=1 << 20, dims=(128, 8, 1000), strides=(256, 2048), box=(64, 1, 64),
            swizzle=128)


def test_tensor_map_accepts_a_valid_geometry():
    runtime.check_tiled(**GOOD)


@pytest.mark.parametrize("change, message", [
    (dict(ptr=(1 << 20) + 8), "16-byte aligned"),
    (dict(strides=(200, 2048)), "multiple of 16 bytes"),
    (dict(box=(64, 1, 512)), "box size 512"),
    (dict(box=(128, 1, 64)), "exceeds the 128-byte swizzle"),
    (dict(box=(4, 1, 64), swizzle=0), "multiple of 16"),
    (dict(dtype="complex64"), "no TMA encoding"),
    (dict(strides=(256,)), "rank-1 strides"),
    (dict(swizzle=96), "swizzle must be"),
    (dict(l2_promotion=512), "l2_promotion must be"),
])
def test_tensor_map_rejects_bad_geometry_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=message) as info:
        runtime.check_tiled(**{**GOOD, **change})
    assert str(info.value).startswith("k:")


# ---- packaging ----
def test_wheel_ships_templates_and_headers(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("pykda-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pykda/templates/decode.cu.j2" in names
    for header in ("common.cuh", "ptx.cuh", "mma.cuh"):
        assert f"pykda/kernels_cu/{header}" in names
    assert not any(n.endswith((".so", ".cubin")) for n in names)
