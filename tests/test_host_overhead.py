"""Host cost of a `fused_recurrent_kda` call and of a small `chunk_kda` call (a chunked-prefill
step), measured on a machine without a GPU.

The GPU is stubbed where it must be and nowhere else:
- `as_device_array` rejects CPU tensors, so the timed copy is the module's own source with
  `.is_cuda` read as `.is_cpu` (a getter of the same cost) and run on CPU torch tensors;
- `cuLaunchKernelEx` is libc's `strnlen`, called as the runtime calls the driver (no prototype,
  the same ctypes objects); with the kernel handle 0 as its length it returns 0 = success;
- the compiled kernel, the device check, torch's current-stream lookup and the driver's tensor-map
  encoder are stand-ins.

`python tests/test_host_overhead.py` prints µs per piece; the tests check that the stubbed call
packs exactly the parameters the kernel expects (so the numbers time the real path).
"""
from __future__ import annotations

import contextlib
import ctypes
import inspect
import struct
import sys
import timeit
import types

import numpy as np
import pytest


def test_torch_ops_varlen_checkpoints_ask_for_the_buffer_not_for_the_dropped_cu_seqlens_cpu():
    """pykda.torch_ops.chunk_kda drops cu_seqlens_cpu (its docstring: checkpoints with cu_seqlens
    need an intermediate_states buffer); a call without the buffer must say so, not ask for the
    cu_seqlens_cpu the caller gave (the eager function's message, reached through the op)."""
    import pykda.torch_ops as ops
    twin = cpu_twin_of_arrays()
    px, pcu, _, _ = prefill_inputs()
    with stubbed_gpu(twin):
        o, fs, ckpt = kda.chunk_kda(**px, **PREFILL_FLAGS, cu_seqlens=pcu, cu_seqlens_cpu=pcu,
                                    return_intermediate_states=True)   # eager: sized from cu_seqlens_cpu
        assert tuple(ckpt.shape[:2]) == (1, 4 + 1 + 1 + 5)
        with pytest.raises(ValueError, match="intermediate_states buffer") as exc:
            ops.chunk_kda(**px, **PREFILL_FLAGS, cu_seqlens=pcu, cu_seqlens_cpu=pcu, return_intermediate_states=True)
        assert "needs cu_seqlens_cpu" not in str(exc.value)
        buf = torch.zeros(1, 11, H, D, D)
        assert ops.chunk_kda(**px, **PREFILL_FLAGS, cu_seqlens=pcu, cu_seqlens_cpu=pcu,
                             return_intermediate_states=True, intermediate_states=buf)[2] is buf

if __name__ == "__main__":   # run as a script: this checkout's pykda and tests/fakes.py
    from pathlib import Path
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

from pykda.ops import kda, kda_decode  # noqa: E402
from pykda.ops.kda_variant import SAFE_GATE_FLAGS  # noqa: E402
from pykda.runtime import arrays, device, launch, tensormap  # noqa: E402

from fakes import device_array  # noqa: E402

B, H, D = 1, 32, 128
# the flags of the timed calls: pykda's safe gate (L2 norm, bounded gate, sigmoid(beta) in the kernel), V-first pool
FLAGS = dict(SAFE_GATE_FLAGS._asdict(), state_v_first=True)


def cpu_twin_of_arrays() -> types.ModuleType:
    """pykda.runtime.arrays, compiled from its own source with `.is_cuda` read as `.is_cpu`."""
    src = inspect.getsource(arrays).replace(".is_cuda", ".is_cpu")
    mod = types.ModuleType("pykda.runtime._arrays_cpu_twin")
    mod.__package__ = "pykda.runtime"
    exec(compile(src, "<arrays cpu twin>", "exec"), mod.__dict__)
    return mod


def cpu_inputs(pool_dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    bf = torch.bfloat16
    x = dict(q=rnd(B, 1, H, D).to(bf), k=rnd(B, 1, H, D).to(bf), v=rnd(B, 1, H, D).to(bf),
             g=rnd(B, 1, H, D).to(bf), beta=rnd(B, 1, H).to(bf), A_log=rnd(H), dt_bias=rnd(H * D))
    pool = rnd(2 * B, H, D, D).to(pool_dtype)
    idx = torch.arange(B, dtype=torch.int32)
    return x, pool, idx


class _Launches:
    """cuLaunchKernelEx's ctypes entry point as the runtime makes it (no prototype), around
    libc's strnlen(config, handle = 0) = 0: the argument passing is the real one."""

    def __init__(self):
        ex = ctypes.CDLL("libc.so.6").strnlen   # a function object of its own: no argtypes
        ex.restype = ctypes.c_int
        self.entries = (ex, lambda code, out: 0)

    def driver(self):
        return self.entries


@contextlib.contextmanager
def stubbed_gpu(twin: types.ModuleType, launcher_type=launch.Launcher):
    """fused_recurrent_kda runs on CPU tensors up to (and through) the ctypes launch call."""
    from pykda import runtime
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name, None), hasattr(obj, name)))
        setattr(obj, name, value)

    info = device.DeviceInfo(0, "fake H200", (9, 0), 132, 232448, 233472, 60 << 20)
    kernels = {}

    def get_kernel(spec, dev, name):
        if name not in kernels:
            kernels[name] = launch.Kernel(types.SimpleNamespace(ptr=0), name, dev)
            kernels[name]._smem_limit = info.smem_per_block_optin   # as if already raised: no driver call
        return kernels[name]

    patch(launch, "_driver", _Launches().driver)
    patch(device, "gpu_available", lambda: True)
    patch(runtime, "device_info", lambda i: info)
    patch(runtime, "get_kernel", get_kernel)
    patch(launch, "Launcher", launcher_type)   # what Kernel.launcher_for makes
    patch(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0)
    patch(tensormap, "_encode", lambda *geometry: bytes(128))
    for op in (kda_decode, kda):
        patch(op, "CallArrays", twin.CallArrays)
        op.PREPARED.clear()   # prepared calls hold the stubbed kernels: none before, none left after
    try:
        yield kernels
    finally:
        kda_decode.PREPARED.clear()
        kda.PREPARED.clear()
        for obj, name, value, existed in reversed(saved):
            if existed:
                setattr(obj, name, value)
            else:
                delattr(obj, name)


SCALE = 1.0   # of the timed loops' lengths (the test that runs measure() shrinks it)


def _per_call_us(fn, number=2000, repeat=7) -> float:
    fn()
    number = max(1, int(number * SCALE))
    return min(timeit.repeat(fn, number=number, repeat=max(1, int(repeat * SCALE)))) / number * 1e6


def measure() -> dict[str, float]:
    """µs per piece of one fused_recurrent_kda call (B 1, H 32, D 128, fp32 pool)."""
    twin = cpu_twin_of_arrays()
    x, pool, idx = cpu_inputs()
    out = torch.empty(B, 1, H, D, dtype=torch.bfloat16)
    tensors = [(x[n], n) for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
    tensors += [(pool, "initial_state"), (idx, "state_indices"), (out, "out")]
    as_dev = twin.as_device_array
    res = {}

    def view10():
        for t, n in tensors:
            as_dev(t, n)
    res["as_device_array x10 (torch)"] = _per_call_us(view10)

    kernel = launch.Kernel(types.SimpleNamespace(ptr=0), "kda_decode", 0)
    layout = np.arange(18, dtype=np.int64).tobytes()
    args = (1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, layout, 1 << 30, 1 << 30, 1 << 30, np.int32(2),
            1 << 30, 0, np.int32(1), 1 << 30, np.float32(-5.0), np.float32(0.088))
    res["param_layout (cold)"] = _per_call_us(lambda: launch.param_layout(args), number=500)
    fmt, _ = launch.param_layout(args)
    buf = ctypes.create_string_buffer(fmt.size)
    res["struct pack_into (16 args)"] = _per_call_us(lambda: fmt.pack_into(buf, 0, *args))
    saved = launch._driver
    launch._driver = _Launches().driver
    try:
        res["Kernel.launch (stub driver)"] = _per_call_us(
            lambda: kernel.launch((4, H, B), (128, 1, 1), args, 0, 0))
    finally:
        launch._driver = saved

    with stubbed_gpu(twin):
        def fakes(batch):   # the call's arrays, as fakes: a new set each time, as each call makes
            f = device_array
            return (f((batch, 1, H, D)), f((batch, 1, H, D)), f((batch, 1, H, D)), f((batch, 1, H, D)),
                    f((batch, 1, H)), f((H,), "float32"), f((H * D,), "float32"), f((2 * batch, H, D, D), "float32"),
                    f((batch,), "int32"), None, None, None)
        names, settings = kda_decode.ARGUMENTS, (None, SAFE_GATE_FLAGS, True, None, None)

        def prepare(arrays):
            return kda_decode.PREPARED.get((arrays.key, settings), arrays, settings)
        same = [arrays.CallArrays(fakes(B), names, kda_decode.REQUIRED) for _ in range(2)]
        res["memoized prepare (repeat of last call)"] = _per_call_us(
            lambda: (prepare(same[0]), prepare(same[1])), number=1000) / 2
        other = [arrays.CallArrays(fakes(b), names, kda_decode.REQUIRED) for b in (B, B + 1)]
        res["memoized prepare (alternating problems)"] = _per_call_us(
            lambda: (prepare(other[0]), prepare(other[1])), number=1000) / 2
        res["CallArrays of the call's 11 arguments"] = _per_call_us(
            lambda: twin.CallArrays((x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], pool, idx,
                                     None, None, None), names, kda_decode.REQUIRED))
        call = lambda: kda_decode.fused_recurrent_kda(**x, **FLAGS, initial_state=pool, state_indices=idx)  # noqa: E731
        res["fused_recurrent_kda (stubbed GPU)"] = _per_call_us(call)
        call_out = lambda: kda_decode.fused_recurrent_kda(**x, **FLAGS, initial_state=pool, state_indices=idx,  # noqa: E731
                                                          out=out)
        res["  same, out= given"] = _per_call_us(call_out)
        px, pcu, ppool, pidx = prefill_inputs()
        res[f"chunk_kda (stubbed GPU, {PREFILL_LABEL})"] = _per_call_us(
            lambda: kda.chunk_kda(**px, **PREFILL_FLAGS, cu_seqlens=pcu, initial_state=ppool, state_indices=pidx),
            number=500)
    return res


# a chunked-prefill step as serving calls it: 4 packed sequences, Kimi Linear's gate, the state pool
PREFILL_LENGTHS = (200, 50, 1, 261)
PREFILL_LABEL = f"H {H}, N {len(PREFILL_LENGTHS)}, T {sum(PREFILL_LENGTHS)}, pool"
PREFILL_FLAGS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     state_v_first=True)


def prefill_inputs():
    g = torch.Generator().manual_seed(1)
    T, N = sum(PREFILL_LENGTHS), len(PREFILL_LENGTHS)
    rnd = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    bf = torch.bfloat16
    x = dict(q=rnd(1, T, H, D).to(bf), k=rnd(1, T, H, D).to(bf), v=rnd(1, T, H, D).to(bf),
             g=rnd(1, T, H, D).to(bf), beta=rnd(1, T, H).to(bf), A_log=rnd(H), dt_bias=rnd(H * D))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(PREFILL_LENGTHS)]), dtype=torch.int32)
    return x, cu, rnd(2 * N, H, D, D), torch.arange(N, dtype=torch.int32)


# ---- tests: the stubbed path is the real one ----
def test_cpu_twin_views_torch_tensors_like_the_real_path():
    twin = cpu_twin_of_arrays()
    t = torch.zeros(3, 4, 8, dtype=torch.bfloat16)[:, 1:3]
    a = twin.as_device_array(t, "q")
    assert (a.ptr, tuple(a.shape), tuple(a.strides), a.dtype, a.device, a.framework) == \
        (t.data_ptr(), (3, 2, 8), (32, 8, 1), "bfloat16", -1, "torch")
    assert a.obj is t
    with pytest.raises(TypeError, match="q must be a CUDA tensor; got a torch tensor on cpu"):
        arrays.as_device_array(t, "q")


class _SpyLauncher(launch.Launcher):
    calls: list = []   # the argument tuples of every launch

    def __call__(self, config, args, stream):
        _SpyLauncher.calls.append(args)
        super().__call__(config, args, stream)


def test_stubbed_call_packs_the_kernel_parameters():
    """The parameter buffer handed to cuLaunchKernelEx holds every argument at its offset, and
    its config the kernel's geometry."""
    twin = cpu_twin_of_arrays()
    x, pool, idx = cpu_inputs()
    seen = []
    _SpyLauncher.calls = []
    with stubbed_gpu(twin, _SpyLauncher):
        entries = launch._driver()

        def spy(config_ref, handle, params, extra):
            config = config_ref._obj
            geometry = tuple(getattr(config, f) for f, _ in launch.LaunchConfig._fields_)
            seen.append(((handle.value or 0,) + geometry, [params[i] for i in range(len(params))]))
            return entries[0](config_ref, handle, params, extra)
        launch._driver = lambda: (spy,) + entries[1:]
        out = torch.empty(B, 1, H, D, dtype=torch.bfloat16)
        for _ in range(2):   # the second call reuses the parameter buffer
            o, final = kda_decode.fused_recurrent_kda(**x, **FLAGS, initial_state=pool, state_indices=idx, out=out,
                                                      scale=0.5)
            assert o is out and final is None
        assert len(seen) == 2 and len(_SpyLauncher.calls) == 2
        args = _SpyLauncher.calls[-1]
        assert launch.signature(args) == kda_decode.KERNEL_SIGNATURE
        geometry, pointers = seen[-1]
        assert geometry[0] == 0 and geometry[8] in (0, None)   # the kernel handle, the stream
        assert geometry[4:7] == ((kda_decode.WARPS + 1) * 32, 1, 1) and geometry[2:4] == (1, 1)
        layout, offsets = launch.param_layout(args)
        base = pointers[0] - offsets[0]
        assert [p - base for p in pointers] == list(offsets)
        packed = layout.unpack(ctypes.string_at(base, layout.size))
        assert len(packed) == len(args)
        for got, want in zip(packed, args):
            assert got == (want if type(want) is not np.float32 else float(want))
        ptrs = [a for a in args if type(a) is int]
        for t in (x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], pool, idx, out):
            assert t.data_ptr() in ptrs
        assert np.float32(0.5) in args


def _driver_reads(sigs: dict) -> tuple[list, object]:
    """A spy for cuLaunchKernelEx that records, per launch, the kernel parameters the driver would
    read through kernelParams (each decoded by the signature of its count in `sigs`), then calls
    the stub; and the list it records into."""
    seen, entry = [], launch._driver()[0]

    def spy(config_ref, handle, params, extra):
        sig = sigs[len(params)] if len(params) in sigs else pytest.fail(f"a launch of {len(params)} parameters")
        args = []
        for i, t in enumerate(sig):
            if type(t) is int:   # a struct of t bytes
                args.append(ctypes.string_at(params[i], t))
            else:
                code, size = launch._SCALARS[t]
                args.append(struct.unpack("<" + code, ctypes.string_at(params[i], size))[0])
        seen.append((sig, args))
        return entry(config_ref, handle, params, extra)
    return seen, spy


def test_stubbed_chunk_kda_runs_every_launch():
    """The stubbed prefill call goes through validation, the plan and every launch, twice (the
    second from the prepared call); each launch's parameters, where the driver reads them, hold
    the call's pointers (the tensors, the new output, the workspace) beside the prepared constants."""
    twin = cpu_twin_of_arrays()
    x, cu, pool, idx = prefill_inputs()
    with stubbed_gpu(twin) as kernels:
        seen, spy = _driver_reads({len(kda.PREPARE_SIGNATURE): kda.PREPARE_SIGNATURE,
                                   len(kda.RECURRENCE_SIGNATURE): kda.RECURRENCE_SIGNATURE})
        entries = launch._driver()
        launch._driver = lambda: (spy,) + entries[1:]
        outs = []
        for _ in range(2):
            o, final = kda.chunk_kda(**x, **PREFILL_FLAGS, cu_seqlens=cu, initial_state=pool, state_indices=idx,
                                     output_final_state=True)
            assert tuple(o.shape) == tuple(x["v"].shape) and final is pool
            outs.append(o)
        assert len(kda.PREPARED.results) == 1
    assert set(kernels) == {"kda_prepare", "kda_recurrence"}   # too short for segments
    assert [sig for sig, _ in seen] == [kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE] * 2
    T = x["q"].shape[1]
    for (_, prep), (_, rec), o in zip(seen[0::2], seen[1::2], outs):
        for i, n in enumerate(("q", "k", "g", "beta")):   # each one's pointer and 3 strides
            assert prep[4 * i:4 * i + 4] == [x[n].data_ptr(), *x[n].stride()[:3]]
        assert prep[16:20] == [x["A_log"].data_ptr(), x["dt_bias"].data_ptr(), cu.data_ptr(), 0]
        assert prep[20:22] == [len(PREFILL_LENGTHS), T] and prep[-1] == rec[1] != 0   # the records
        assert rec[0] == bytes(128) and rec[2] == cu.data_ptr() and rec[6] == o.data_ptr()
        assert rec[10] == rec[11] == pool.data_ptr() and rec[13] == idx.data_ptr()   # the pool, in place


def test_stubbed_rank_slice_launches_around_its_start(monkeypatch):
    """A rank's slice on the real launch path: prepare, pass 1 and the scan of its map (into the
    call's new map array), then start_of, then the scan of the starts from the start it returned
    and pass 2; the call's values are packed again for those two."""
    twin = cpu_twin_of_arrays()
    monkeypatch.setattr(kda, "as_device_array", twin.as_device_array)   # start_of's result: a CPU tensor here
    g = torch.Generator().manual_seed(2)
    B, T, H = 2, 1000, 2
    x = {n: torch.randn(B, T, H, D, generator=g).to(torch.bfloat16) for n in ("q", "k", "v", "g")}
    x["beta"] = torch.randn(B, T, H, generator=g).to(torch.bfloat16)
    made = []

    def start_of(total):
        made.append((total, torch.zeros(B, H, D, D)))
        return made[-1][1]
    with stubbed_gpu(twin):
        seen, spy = _driver_reads({len(sig): sig for sig in (kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE,
                                                             kda.SCAN_SIGNATURE)})
        entries = launch._driver()
        launch._driver = lambda: (spy,) + entries[1:]
        for _ in range(2):
            o, fs = kda.chunk_kda_slice(*(x[n] for n in ("q", "k", "v", "g", "beta")), start_of, A_log=torch.randn(H),
                                        dt_bias=torch.randn(H * D), **SAFE_GATE_FLAGS._asdict(),
                                        output_final_state=True, segment_chunks=5, warps=4)
    sigs = [kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE, kda.SCAN_SIGNATURE, kda.SCAN_SIGNATURE,
            kda.RECURRENCE_SIGNATURE]
    assert [sig for sig, _ in seen] == sigs * 2
    (_, prep), (_, pass1), (_, total_scan), (_, start_scan), (_, pass2) = seen[5:]
    total, start = made[-1]
    assert total_scan[-1] == total.data_ptr() and start_scan[-1] == start.data_ptr()
    assert total_scan[:-1] == start_scan[:-1] and total_scan[0] != 0   # the maps, after the records
    assert pass1 == pass2 and pass2[6] == o.data_ptr() and pass2[11] == fs.data_ptr()
    assert prep[-1] == pass2[1] and pass2[18] == 5   # the records; chunks per segment


def test_the_measurement_script_runs(monkeypatch):
    """`python tests/test_host_overhead.py` (shortened): every piece times a call that works."""
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 0.01)
    res = measure()
    assert all(v > 0 for v in res.values()) and any(k.startswith("chunk_kda") for k in res)


def test_measure_runs():
    twin = cpu_twin_of_arrays()
    x, pool, idx = cpu_inputs()
    with stubbed_gpu(twin):
        o, final = kda_decode.fused_recurrent_kda(**x, **FLAGS, initial_state=pool, state_indices=idx,
                                                  output_final_state=True)
    assert tuple(o.shape) == (B, 1, H, D) and o.dtype == torch.bfloat16
    assert final is pool   # updated in place, returned when asked for


if __name__ == "__main__":
    import pykda
    print(f"pykda from {Path(pykda.__file__).parent}")
    for k, v in measure().items():
        print(f"{k:<40} {v:7.2f} µs")
