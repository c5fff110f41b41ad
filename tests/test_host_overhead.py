"""Host cost of the ops' calls (`fused_recurrent_kda`, a small `chunk_kda` call (a chunked-prefill
step), the flash decodes and a paged run), measured on a machine without a GPU.

The GPU is stubbed where it must be and nowhere else:
- `as_device_array` rejects CPU tensors, so the timed copy is the module's own source with
  `.is_cuda` read as `.is_cpu` (a getter of the same cost) and run on CPU torch tensors;
- `cuLaunchKernelEx` is libc's `strnlen`, called as the runtime calls the driver (no prototype,
  the same ctypes objects); with the kernel handle 0 as its length it returns 0 = success;
- the compiled kernel, the device check, torch's current-stream lookup, the driver's tensor-map
  encoder (a map holds its address) and the paged plan's copy to the device (on the CPU memory)
  are stand-ins; the workspace's blocks (torch's CPU allocator here) are recorded.

`python tests/test_host_overhead.py` prints µs per piece; the tests check that each stubbed call
hands the driver exactly the parameters the kernel expects (so the numbers time the real path).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
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

from pykda.ops import decode, kda, kda_decode, paged_decode  # noqa: E402
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


def tensor_map(ptr: int) -> bytes:
    """The stubbed encoder's tensor map of the address `ptr` (any geometry)."""
    return ptr.to_bytes(8, "little") * 16


@contextlib.contextmanager
def stubbed_gpu(twin: types.ModuleType):
    """The ops run on CPU tensors up to (and through) the ctypes launch call. Yields the stubbed
    kernels by name (`kernels`) and the workspace blocks taken from torch as (pointer, bytes,
    stream) (`scratch`)."""
    from pykda import runtime
    workspace = sys.modules["pykda.runtime.workspace"]
    saved, scratch = [], []

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
    patch(launch, "_graph_driver", lambda: None)   # launches one by one (the graph path: test_runtime)
    patch(device, "gpu_available", lambda: True)
    patch(runtime, "device_info", lambda i: info)
    def torch_scratch(t, nbytes, stream, real=workspace.torch_scratch):
        owner, ptr = real(t, nbytes, stream)
        scratch.append((ptr, nbytes, stream))
        return owner, ptr

    patch(runtime, "get_kernel", get_kernel)
    patch(runtime, "load_specs", lambda specs, dev, jobs=None: None)
    patch(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0)
    patch(tensormap, "_encode", lambda dtype, ptr, *geometry: tensor_map(ptr))
    patch(workspace, "torch_scratch", torch_scratch)
    patch(twin, "copy_from_host", lambda ptr, host, dev, stream: ctypes.memmove(ptr, host.ctypes.data, host.nbytes))
    patch(paged_decode, "device_arrays", twin)   # plan()'s page ids and tables
    ops = (kda_decode, kda, decode, paged_decode)
    for op in ops:
        patch(op, "CallArrays", twin.CallArrays)
        op.PREPARED.clear()   # prepared calls hold the stubbed kernels: none before, none left after
    try:
        yield types.SimpleNamespace(kernels=kernels, scratch=scratch)
    finally:
        for op in ops:
            op.PREPARED.clear()
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
    """µs per piece of one fused_recurrent_kda call (B 1, H 32, D 128, fp32 pool), then µs per call
    of a chunk_kda prefill step and of the decode calls."""
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
                    f((batch,), "int32"), None, None, None, None, None, None)
        names, settings = kda_decode.ARGUMENTS, (None, SAFE_GATE_FLAGS, True, None, None, False, 0)

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
        for label, call in decode_calls().items():
            res[label] = _per_call_us(call)
    return res


def decode_calls() -> dict:
    """The README's decode calls by label (torch's lazily mapped empty caches), within stubbed_gpu:
    a single sequence, a padded batch with kv_lens and the LSE, a paged run (planned here)."""
    bf, hq, hkv = torch.bfloat16, 32, 8
    q, k, v = torch.randn(hq, D).to(bf), torch.empty(32768, hkv, D, dtype=bf), torch.empty(32768, hkv, D, dtype=bf)
    batch, S = 64, 4096
    qb, kb, vb = torch.randn(batch, hq, D).to(bf), *(torch.empty(batch, hkv, S, D, dtype=bf) for _ in "kv")
    lens = torch.randint(1, S + 1, (batch,), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    page, rows = 16, 1024
    kp, vp = (torch.empty(batch * rows // page, page, hkv, D, dtype=bf) for _ in "kv")
    dec = paged_decode.BatchDecodeWithPagedKVCache("NHD")
    dec.plan(np.arange(0, batch * rows // page + 1, rows // page, dtype=np.int32),
             torch.arange(batch * rows // page, dtype=torch.int32), np.full(batch, page, np.int32), hq, hkv, D, page)
    return {f"single_decode (stubbed GPU, H {hq}/{hkv}, kv_len 32768)":
            functools.partial(decode.single_decode_with_kv_cache, q, k, v),
            f"batch_decode (stubbed GPU, B {batch}, HND S {S}, kv_lens, lse)":
            functools.partial(decode.batch_decode_with_padded_kv_cache, qb, kb, vb, kv_layout="HND", kv_lens=lens,
                              return_lse=True),
            f"paged run (stubbed GPU, B {batch}, page {page}, {rows} rows each)":
            functools.partial(dec.run, qb, kp, vp)}


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


def _driver_reads(*sigs) -> list:
    """Within stubbed_gpu: a spy in place of cuLaunchKernelEx that records, per launch, the kernel
    parameters the driver would read through kernelParams (the i-th launch's decoded by
    sigs[i % len(sigs)]: the signatures in launch order, which must have the launch's count) and
    its config's (grid, block, smem, stream), then calls the stub; the list it records into."""
    entries, seen = launch._driver(), []

    def spy(config_ref, handle, params, extra):
        sig = sigs[len(seen) % len(sigs)]
        if len(sig) != len(params):
            pytest.fail(f"launch {len(seen)}: {len(params)} parameters, its signature has {len(sig)}")
        args = []
        for i, t in enumerate(sig):
            if type(t) is int:   # a struct of t bytes
                args.append(ctypes.string_at(params[i], t))
            else:
                code, size = launch._SCALARS[t]
                args.append(struct.unpack("<" + code, ctypes.string_at(params[i], size))[0])
        c = config_ref._obj
        seen.append((sig, args, ((c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z), c.smem,
                                 c.stream or 0)))
        return entries[0](config_ref, handle, params, extra)
    launch._driver = lambda: (spy,) + entries[1:]
    return seen


def test_stubbed_fused_recurrent_kda_reads_the_call_values():
    """fused_recurrent_kda on the real launch path, twice with other arrays of the same layout (the
    second from the prepared call): the driver reads each call's pointers, its new out among them,
    beside the prepared constants (the strides' Layout, the pool's rows and row stride, the sizes,
    the gate's bound, the scale), in the plan's geometry."""
    twin = cpu_twin_of_arrays()
    calls = []
    with stubbed_gpu(twin):
        seen = _driver_reads(kda_decode.KERNEL_SIGNATURE)
        for _ in range(2):
            x, pool, idx = cpu_inputs()
            o, final = kda_decode.fused_recurrent_kda(**x, **FLAGS, initial_state=pool, state_indices=idx, scale=0.5,
                                                      output_final_state=True)
            assert final is pool and tuple(o.shape) == (B, 1, H, D)
            calls.append((x, pool, idx, o))
        assert len(kda_decode.PREPARED.results) == 1
        plan = kda_decode.PREPARED.last[1].plan
    assert calls[0][0]["q"].data_ptr() != calls[1][0]["q"].data_ptr()
    assert len(seen) == 2
    for (_, params, geometry), (x, pool, idx, o) in zip(seen, calls):
        assert geometry == ((plan.grid, 1, 1), ((kda_decode.WARPS + 1) * 32, 1, 1), plan.smem, 0)
        assert params[:5] == [x[n].data_ptr() for n in ("q", "k", "g", "v", "beta")]
        strides = [s for n in ("q", "k", "g", "v") for s in x[n].stride()[:3]] + [*x["beta"].stride(), *o.stride()[:3]]
        assert params[5] == np.asarray(strides, np.int64).tobytes()   # the Layout struct
        assert params[6:13] == [x["A_log"].data_ptr(), x["dt_bias"].data_ptr(), pool.data_ptr(), 2 * B, 0,
                                pool.stride(0), idx.data_ptr()]   # (rows from 0 on are the pool's)
        assert params[13:] == [0, 0, 0, 0, 1, H, plan.n_tiles, o.data_ptr(), -5.0, 0.5, 0, 0, 0, 0, 0, 1,
                              0, 0, 0, 0]   # no verify, no tree


def _workspace(call: decode.DecodeCall, scratch: list) -> list:
    """What both launches of a split decode read as ws_o and ws_lse: the next of the `scratch`
    blocks (the call's bytes, for its stream), its partial outputs from its start, its LSE from
    call.lse_offset; 0s without a split (no block taken)."""
    if not call.workspace_bytes:
        return [0, 0]
    ptr, nbytes, stream = scratch.pop(0)
    assert (nbytes, stream) == (call.workspace_bytes, 0) and ptr != 0
    return [ptr, ptr + call.lse_offset]


def _merge_geometry(batch: int, q_heads: int, row_warps: int) -> tuple:
    """decode_merge's (grid, block, smem, stream): 8 warps a CTA, `row_warps` per (query row, 32 columns)."""
    return (-(-batch * q_heads // (8 // row_warps)), D // 32, 1), (256, 1, 1), 0, 0


def test_stubbed_single_decode_reads_the_call_values():
    """single_decode_with_kv_cache (a split plan, with the LSE) twice with other arrays: the driver
    reads each call's q, the tensor maps of its K and V, its new out and LSE, its workspace and its
    K and V beside the prepared strides and row parameters, in the plan's grid; then decode_merge
    reads the same workspace, out and LSE beside the row count, heads, chunks and out's strides."""
    twin = cpu_twin_of_arrays()
    hq, hkv, S, bf = 8, 2, 4096, torch.bfloat16
    calls = []
    with stubbed_gpu(twin) as gpu:
        seen = _driver_reads(decode.KERNEL_SIGNATURE, decode.MERGE_SIGNATURE)
        for _ in range(2):
            q, k, v = torch.randn(hq, D).to(bf), torch.empty(S, hkv, D, dtype=bf), torch.empty(S, hkv, D, dtype=bf)
            o, lse = decode.single_decode_with_kv_cache(q, k, v, return_lse=True)
            calls.append((q, k, v, o, lse))
        assert len(decode.PREPARED.results) == 1
        call = decode.PREPARED.last[1]
    chunk, n_chunks = call.plan.chunk, call.plan.n_chunks
    # 4096 = 32 · 128 rows: 32 chunks (ceil of an exact multiple: no extra chunk)
    assert call.plan.split and chunk == 128 and n_chunks == -(-S // chunk) == 32
    assert len(seen) == 4 and len(gpu.scratch) == 2
    assert set(gpu.kernels) == {"decode_partial", "decode_merge"}
    for (_, params, geometry), (_, merge, merge_geometry), (q, k, v, o, lse) in zip(seen[0::2], seen[1::2], calls):
        ws = _workspace(call, gpu.scratch)
        assert geometry == ((n_chunks, hkv, 1), ((decode.WARPS + 1) * 32, 1, 1), call.plan.smem, 0)
        maps = [tensor_map(k.data_ptr()), tensor_map(v.data_ptr())]
        assert params[:8] == [q.data_ptr(), 0, D, *maps, *maps, 0]   # no lengths: the tails are the whole tiles'
        assert params[8:13] == [S, hq // hkv, hq // hkv, 1, float(np.float32(D ** -0.5))]
        assert params[13:16] == ws + [o.data_ptr()]
        assert params[16:] == [0, D, lse.data_ptr(), 0, 0, k.data_ptr(), v.data_ptr(), 0, 0, 0, 0, chunk, hkv, 1, 0]
        assert call.plan.merge_warps == 8 and merge_geometry == _merge_geometry(1, hq, 8)   # 32 chunks: a CTA a row
        assert merge == ws + [0, S, hq, n_chunks, chunk, o.data_ptr(), 0, D, lse.data_ptr(), 8, hq, hkv, 1]


def test_stubbed_padded_batch_decode_reads_the_call_values():
    """batch_decode_with_padded_kv_cache (HND, kv_lens, a strided out, two head blocks, unsplit) twice
    with other arrays: the driver reads each call's q, maps, kv_lens, out and K and V beside the
    prepared strides and row parameters; no workspace, and no launch but decode_partial."""
    twin = cpu_twin_of_arrays()
    batch, hq, hkv, S, bf = 3, 32, 1, 200, torch.bfloat16
    calls = []
    with stubbed_gpu(twin) as gpu:
        seen = _driver_reads(decode.KERNEL_SIGNATURE)
        for _ in range(2):
            q, out = torch.randn(batch, hq, D).to(bf), torch.empty(batch, hq, 2 * D, dtype=bf)[..., :D]   # rows apart
            k, v = (torch.empty(batch, hkv, S, D, dtype=bf) for _ in "kv")
            lens = torch.tensor([S, 0, 7], dtype=torch.int32)
            o = decode.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=lens, out=out,
                                                         chunk_size=256)
            assert o is out
            calls.append((q, k, v, lens, out))
        assert len(decode.PREPARED.results) == 1
        call = decode.PREPARED.last[1]
    assert not call.plan.split and gpu.scratch == [] and len(seen) == 2   # the spy: 30 parameters each
    assert list(gpu.kernels) == ["decode_partial"]
    for (_, params, geometry), (q, k, v, lens, out) in zip(seen, calls):
        assert geometry == ((1, hkv, batch * 2), ((decode.WARPS + 1) * 32, 1, 1), call.plan.smem, 0)
        maps = [tensor_map(k.data_ptr()), tensor_map(v.data_ptr())]   # (the stub's maps: the address alone)
        assert params[:8] == [q.data_ptr(), hq * D, D, *maps, *maps, lens.data_ptr()]
        assert params[8:13] == [S, hq, 16, 2, float(np.float32(D ** -0.5))]
        assert params[13:] == [0, 0, out.data_ptr(), *out.stride()[:2], 0, 0, 0, k.data_ptr(), v.data_ptr(), 0, 0,
                               0, 0, 256, hkv, batch, 0]   # the chunk asked for, KV heads, batch; no page ids


@pytest.mark.parametrize("page_size", [8, 16, 64])   # pages gathered (no tensor maps), by TMA, with tail maps
def test_stubbed_paged_run_reads_the_call_values(page_size):
    """BatchDecodeWithPagedKVCache: plan() copies the rows and first page entries to its tables
    (and launches page_snapshot for the first page ids after them: a batch decode_tiny may run);
    two run()s (split) with other queries and caches: the driver reads each run's q, the maps of its
    caches (zeros where pages are gathered), the tables (rows, then first entries), the page ids,
    the new out and LSE, the workspace and the caches beside the prepared strides and the pages'
    count and strides; then decode_merge reads the workspace, the tables (rows), out and LSE beside
    the row bound, heads, chunks and out's strides."""
    twin = cpu_twin_of_arrays()
    hq, hkv, lens, bf = 8, 2, (600, 0, 37), torch.bfloat16
    pages = [-(-n // page_size) for n in lens]
    num_pages = sum(pages) + 2
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], np.int32)
    indices = torch.randperm(num_pages, generator=torch.Generator().manual_seed(3))[:sum(pages)].to(torch.int32)
    calls = []
    with stubbed_gpu(twin) as gpu:
        dec = paged_decode.BatchDecodeWithPagedKVCache("NHD")
        dec.plan(indptr, indices, last, hq, hkv, D, page_size, chunk_size=64)   # split: ceil(600 / 64) = 10 chunks (more than a cluster)
        assert dec._tables[:2 * len(lens)].tolist() == [*lens, *indptr[:-1]]
        assert dec._tables.numel() == (2 + dec._layout.snap_width) * len(lens) and dec._layout.snap_width > 0
        seen = _driver_reads(decode.KERNEL_SIGNATURE, decode.MERGE_SIGNATURE)   # run()'s launches
        for _ in range(2):
            q = torch.randn(len(lens), hq, D).to(bf)
            k, v = (torch.empty(num_pages, page_size, hkv, D, dtype=bf) for _ in "kv")
            o, lse = dec.run(q, k, v, return_lse=True)
            calls.append((q, k, v, o, lse))
        assert len(paged_decode.PREPARED.results) == 1
        call = paged_decode.PREPARED.last[1]
    tables = dec._tables.data_ptr()
    assert call.plan.n_chunks == 10 and len(seen) == 4 and len(gpu.scratch) == 2   # the last of 24 rows
    assert set(gpu.kernels) == {"page_snapshot", "decode_partial", "decode_merge"}
    for (_, params, geometry), (_, merge, merge_geometry), (q, k, v, o, lse) in zip(seen[0::2], seen[1::2], calls):
        ws = _workspace(call, gpu.scratch)
        assert geometry == ((call.plan.n_chunks, hkv, len(lens)), ((decode.WARPS + 1) * 32, 1, 1), call.plan.smem, 0)
        maps = [tensor_map(k.data_ptr()), tensor_map(v.data_ptr())] if page_size >= 16 else [bytes(128)] * 2
        assert params[:8] == [q.data_ptr(), hq * D, D, *maps, *maps, tables]   # pages: tails in the pages' own boxes
        assert params[8:13] == [paged_decode.MAX_ROWS, hq // hkv, hq // hkv, 1, float(np.float32(D ** -0.5))]
        assert params[13:16] == ws + [o.data_ptr()]
        assert params[16:23] == [hq * D, D, lse.data_ptr(), tables + 4 * len(lens), indices.data_ptr(), k.data_ptr(),
                                 v.data_ptr()]
        assert params[23:] == [num_pages, *k.stride()[:3], 64, hkv, len(lens),   # pages' count, strides; chunk, heads,
                               dec._layout.snap_width]                         # batch; page ids copied a request
        assert call.plan.merge_warps == 4 and merge_geometry == _merge_geometry(len(lens), hq, 4)   # 10 chunks
        assert merge == ws + [tables, paged_decode.MAX_ROWS, hq, 10, 64, o.data_ptr(), hq * D, D, lse.data_ptr(), 4,
                              len(lens) * hq, hkv, len(lens)]
    assert gpu.scratch == []   # one block per split call, each checked


def test_stubbed_chunk_kda_runs_every_launch():
    """The stubbed prefill call goes through validation, the plan and every launch, twice (the
    second from the prepared call); each launch's parameters, where the driver reads them, hold
    the call's pointers (the tensors, v's tensor map, the new output, the workspace) beside the
    prepared constants."""
    twin = cpu_twin_of_arrays()
    x, cu, pool, idx = prefill_inputs()
    with stubbed_gpu(twin) as gpu:
        seen = _driver_reads(kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE)
        outs = []
        for _ in range(2):
            o, final = kda.chunk_kda(**x, **PREFILL_FLAGS, cu_seqlens=cu, initial_state=pool, state_indices=idx,
                                     output_final_state=True)
            assert tuple(o.shape) == tuple(x["v"].shape) and final is pool
            outs.append(o)
        assert len(kda.PREPARED.results) == 1
    assert set(gpu.kernels) == {"kda_prepare", "kda_recurrence"}   # too short for segments
    assert len(seen) == 4   # prepare and the recurrence, twice (each of its signature's count: the spy checks)
    T = x["q"].shape[1]
    for (_, prep, _), (_, rec, _), o in zip(seen[0::2], seen[1::2], outs):
        for i, n in enumerate(("q", "k", "g", "beta")):   # each one's pointer and 3 strides
            assert prep[4 * i:4 * i + 4] == [x[n].data_ptr(), *x[n].stride()[:3]]
        assert prep[16:20] == [x["A_log"].data_ptr(), x["dt_bias"].data_ptr(), cu.data_ptr(), 0]
        assert prep[20:22] == [len(PREFILL_LENGTHS), T] and prep[-1] == rec[1] != 0   # the records
        assert rec[0] == tensor_map(x["v"].data_ptr()) and rec[2] == cu.data_ptr() and rec[6] == o.data_ptr()
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
        seen = _driver_reads(kda.PREPARE_SIGNATURE, kda.RECURRENCE_SIGNATURE, kda.SCAN_SIGNATURE, kda.SCAN_SIGNATURE,
                             kda.RECURRENCE_SIGNATURE)
        for _ in range(2):
            o, fs = kda.chunk_kda_slice(*(x[n] for n in ("q", "k", "v", "g", "beta")), start_of, A_log=torch.randn(H),
                                        dt_bias=torch.randn(H * D), **SAFE_GATE_FLAGS._asdict(),
                                        output_final_state=True, segment_chunks=5, warps=4)
    assert len(seen) == 10   # prepare, pass 1, the two scans, pass 2; twice
    (_, prep, _), (_, pass1, _), (_, total_scan, _), (_, start_scan, _), (_, pass2, _) = seen[5:]
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
