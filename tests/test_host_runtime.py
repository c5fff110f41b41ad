"""CPU tests of the host fast paths: the memoized validation key, DeviceArray views, the
parameter buffer and launch configurations, the stream lookup."""
import contextlib
import ctypes
import struct
import sys
import types

import numpy as np
import pytest

from pykda.ops import checks, kda_decode
from pykda.ops.kda_variant import SAFE_GATE_FLAGS
from pykda.runtime import arrays, launch
from pykda.runtime.arrays import DeviceArray

from fakes import BASE, FakeKernel, device_array as arr


# ---- the memo of validated calls: the key sees everything a check may look at ----
def _counting():
    """A validator memoized on the CallArrays key of its arrays, and the list of its real calls."""
    calls = []
    memo = checks.Memo(lambda args: calls.append(1) or len(calls))

    def validate(*objs):
        args = arrays.CallArrays(objs, tuple(f"a{i}" for i in range(len(objs))), 0)
        return memo.get(args.key, args)
    return validate, calls


VARIANTS = {
    "aligned 8": dict(ptr=BASE + 8), "aligned 4": dict(ptr=BASE + 4), "aligned 2": dict(ptr=BASE + 2),
    "aligned 1": dict(ptr=BASE + 1), "strides": dict(strides=(8192, 4096, 128, 1)),
    "dtype": dict(dtype="float16"), "shape": dict(shape=(2, 1, 32, 128)), "device": dict(device=1),
}


def _q(**change):
    return arr(**{"shape": (1, 1, 32, 128), **change})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_memo_key_tells_apart_arrays_differing_in_one_property(variant):
    validate, calls = _counting()
    other = arr((4,), "int32")
    validate(_q(), other)
    validate(_q(), other)
    assert len(calls) == 1   # an equal call is a hit
    validate(_q(**VARIANTS[variant]), other)
    assert len(calls) == 2, f"{variant}: validation skipped"
    validate(_q(), other)     # back to the first: a hit again (not the last call: the dict)
    assert len(calls) == 2
    validate(_q(**VARIANTS[variant]), other)
    assert len(calls) == 2


def test_memo_key_ignores_only_the_pointer_above_16_bytes():
    validate, calls = _counting()
    validate(_q())
    validate(_q(ptr=BASE + 16 * 12345))
    assert len(calls) == 1
    validate(_q(ptr=BASE + 16 * 12345 + 8))
    assert len(calls) == 2


def test_memo_key_tells_apart_none_positions():
    validate, calls = _counting()
    a = _q()
    validate(a, None)
    validate(None, a)
    validate(a)
    assert len(calls) == 3
    validate(a, None)
    assert len(calls) == 3


def test_memo_makes_without_caching_for_an_unhashable_key():
    made = []
    memo = checks.Memo(lambda x: made.append(x) or len(made))
    assert memo.get(("k", 0.5), "a") == 1
    assert memo.get(("k", 0.5), "a") == 1
    assert memo.get(("k", [0.25]), "b") == 2   # made, not cached
    assert memo.get(("k", [0.25]), "b") == 3
    assert memo.get(("k", 0.5), "a") == 1 and made == ["a", "b", "b"]


def test_memo_caches_no_failure():
    calls = []

    def bad(key):
        calls.append(1)
        raise ValueError("bad")
    memo = checks.Memo(bad)
    for _ in range(2):
        with pytest.raises(ValueError):
            memo.get(_q().meta, "key")
    assert len(calls) == 2


def _kda_decode_arrays(**change):
    B, H, D = 2, 4, 128
    a = dict(q=arr((B, 1, H, D)), k=arr((B, 1, H, D)), v=arr((B, 1, H, D)), g=arr((B, 1, H, D)),
             beta=arr((B, 1, H)), A_log=arr((H,), "float32"), dt_bias=arr((H * D,), "float32"),
             state=arr((2 * B, H, D, D), "float32"), state_indices=arr((B,), "int32"), num_accepted_tokens=None, cu_seqlens=None,
             out=None, intermediate_states_buffer=None,
             intermediate_state_indices=None, retrieve_parent_token=None)   # in kda_decode.ARGUMENTS' order
    a.update(change)
    return tuple(a.values())


@pytest.mark.parametrize("change, message", [
    (dict(q=arr((2, 1, 4, 128), ptr=BASE + 8)), "q must start at a 16-byte aligned address"),
    (dict(k=arr((2, 1, 4, 128), strides=(520, 520, 130, 1))), "k: stride 130 of dim 2 is 260 bytes"),
    (dict(state=arr((4, 4, 128, 128), "float32", strides=(4 * 128 * 256, 128 * 256, 256, 1))),
     "initial_state must be contiguous"),
    (dict(state=arr((4, 4, 128, 128), "float64")), "initial_state must have dtype"),
    (dict(g=arr((2, 1, 4, 128), "float16")), "g must have dtype bfloat16 or float32"),
    (dict(beta=arr((2, 1, 4), "float16")), "beta must have dtype bfloat16 or float32"),
    (dict(A_log=arr((1, 1, 5, 1), "float32")), "A_log must hold H = 4 elements"),
])
def test_cached_good_call_never_lets_a_bad_one_through(change, message, monkeypatch):
    prepared = _prepared_decode(monkeypatch)
    settings = (None, SAFE_GATE_FLAGS, True, None, None, False, 0)
    good = _kda_decode_arrays()
    first = prepared(good, settings)
    assert prepared(_kda_decode_arrays(), settings) is first   # a hit
    with pytest.raises((TypeError, ValueError), match=message):
        prepared(_kda_decode_arrays(**change), settings)
    assert prepared(good, settings) is first


def _prepared_decode(monkeypatch):
    """PREPARED.get of a decode call's arrays and settings, with the kernel stubbed."""
    monkeypatch.setattr(kda_decode.runtime, "require_gpu", lambda: None)
    plan = kda_decode.KdaDecodePlan(rpt=8, stages=3, n_tiles=16, grid=16, smem=1024)
    monkeypatch.setattr(kda_decode, "plan_for", lambda p, dev, rpt, stages: (plan, None))
    monkeypatch.setattr(kda_decode.runtime, "get_kernel", lambda spec, dev, name: FakeKernel(name, spec, []))
    monkeypatch.setattr(kda_decode, "PREPARED", checks.Memo(kda_decode.PREPARED.make))   # its fakes stay here

    def prepared(arrays, settings):
        args = arrays_of(arrays)
        return kda_decode.PREPARED.get((args.key, settings), args, settings)
    return prepared


@pytest.mark.parametrize("settings, message", [
    ((None, SAFE_GATE_FLAGS._replace(use_gate_in_kernel=False, lower_bound=None, safe_gate=False), True, None, None,
      False, 0),
     "A_log is given but use_gate_in_kernel=False"),
    ((None, SAFE_GATE_FLAGS, True, None, 1, False, 0), "stages must be in 2..8"),
    ((None, SAFE_GATE_FLAGS._replace(lower_bound=None), True, None, None, False, 0), "needs lower_bound"),
    ((None, SAFE_GATE_FLAGS._replace(lower_bound=float("nan")), True, None, None, False, 0),
     "lower_bound must be finite"),
])
def test_cached_good_call_never_lets_bad_settings_through(settings, message, monkeypatch):
    """The same arrays with other flags: validated again (the settings are part of the key)."""
    prepared = _prepared_decode(monkeypatch)
    good = (None, SAFE_GATE_FLAGS, True, None, None, False, 0)
    first = prepared(_kda_decode_arrays(), good)
    with pytest.raises(ValueError, match=message):
        prepared(_kda_decode_arrays(), settings)
    assert prepared(_kda_decode_arrays(), good) is first
    softplus = (None, SAFE_GATE_FLAGS._replace(lower_bound=None, safe_gate=False), True, None, None, False, 0)
    other = prepared(_kda_decode_arrays(), softplus)
    assert other is not first and other.problem.variant.gate == "softplus" and first.problem.variant.gate == "safe"
    k_first = prepared(_kda_decode_arrays(), (None, SAFE_GATE_FLAGS, False, None, None, False, 0))   # a setting: layout
    assert k_first is not first and first.problem.v_first and not k_first.problem.v_first


def arrays_of(objs):
    return arrays.CallArrays(objs, kda_decode.ARGUMENTS, kda_decode.REQUIRED)


# ---- CallArrays: one pass over a call's arguments ----
def test_call_arrays_of_device_arrays_key_by_meta():
    objs = _kda_decode_arrays()
    c = arrays_of(objs)
    assert c.ptrs == [0 if a is None else a.ptr for a in objs]
    assert c.key == tuple(None if a is None else a.meta for a in objs)
    assert c.views() == list(objs)


def test_call_arrays_refuse_a_missing_required_argument():
    objs = (None,) + _kda_decode_arrays()[1:]
    with pytest.raises(TypeError, match=r"q must be a GPU array \(CuPy, torch, JAX or DLPack\); got NoneType"):
        arrays_of(objs).views()


def test_call_arrays_of_torch_tensors_key_what_validation_sees(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(arrays, "_RAW_STREAM", lambda dev: 500 + dev)
    t = torch.zeros(3, 4, 8, dtype=torch.bfloat16)
    w = torch.nn.Parameter(torch.zeros(8))
    c = arrays.CallArrays((t, w, None), ("a", "w", "o"), 2)
    assert c.ptrs == [t.data_ptr(), w.data_ptr(), 0]
    assert c.key == ((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15),
                     (w.shape, w.stride(), w.dtype, w.device, w.data_ptr() & 15), None)
    assert c.stream() == 500 - 1 and c.stream(7) == 7 and c.result(t) is t
    o, ptr = c.new_contiguous_like(0)
    assert o.shape == t.shape and o.dtype == t.dtype and o.is_contiguous() and ptr == o.data_ptr()
    same = arrays.CallArrays((torch.zeros(3, 4, 8, dtype=torch.bfloat16), w, None), ("a", "w", "o"), 2)
    assert same.key == c.key
    for other in (t[:, :2], t.transpose(0, 1), t.float(), t.view(torch.int16), t[1:]):
        assert arrays.CallArrays((other, w, None), ("a", "w", "o"), 2).key != c.key
    odd = t.reshape(-1)[1:25].view(3, 8)   # 2 bytes off a 16-byte boundary
    assert arrays.CallArrays((odd, w, None), ("a", "w", "o"), 2).key[0][4] == (t.data_ptr() + 2) & 15
    with pytest.raises(TypeError, match="a must be a CUDA tensor; got a torch tensor on cpu"):
        c.views()   # host tensors: the key is torch's, validation refuses them


def test_call_arrays_name_a_tensor_the_hot_path_cannot_read():
    torch = pytest.importorskip("torch")
    sparse = torch.zeros(3, 3).to_sparse()   # no strides: read in full, and refused by name
    with pytest.raises(TypeError, match="w must be a CUDA tensor; got a torch tensor on cpu"):
        arrays.CallArrays((None, sparse, torch.zeros(3)), ("o", "w", "a"), 0)


def test_call_arrays_view_other_tensor_types_in_full():
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass
    s = torch.zeros(4).as_subclass(Sub)
    c = arrays.CallArrays((arr((4,), "float32"), None), ("a", "b"), 1)
    assert c.key == (arr((4,), "float32").meta, None)
    with pytest.raises(TypeError, match="a must be a CUDA tensor"):
        arrays.CallArrays((s, None), ("a", "b"), 1)   # a subclass: viewed by as_device_array, which checks the device


def test_alignment_checks_stay_within_what_the_key_sees():
    checks.check_aligned(arr((4, 8)), "x", 8)
    with pytest.raises(AssertionError, match="must divide 16"):
        checks.check_aligned(arr((4, 8)), "x", 32)


def test_meta_is_what_the_key_sees():
    a = DeviceArray(BASE + 6, (2, 3), (3, 1), "float32", 1, "test", None)
    assert a.meta == ((2, 3), (3, 1), "float32", 1, 6)


# ---- torch views ----
def test_torch_view_matches_the_constructor():
    torch = pytest.importorskip("torch")
    from test_host_overhead import cpu_twin_of_arrays
    twin = cpu_twin_of_arrays()
    t = torch.zeros(5, 6, 8, dtype=torch.float16)[1:, :, 2:]
    a = twin.as_device_array(t, "x")
    b = twin.DeviceArray(t.data_ptr(), t.shape, t.stride(), "float16", -1, "torch", t)
    assert a.obj is b.obj is t
    for slot in set(DeviceArray.__slots__) - {"obj"}:
        assert getattr(a, slot) == getattr(b, slot), slot
    p = twin.as_device_array(torch.nn.Parameter(torch.zeros(3)), "w")   # a subclass: the general path
    assert (p.dtype, tuple(p.shape), p.framework) == ("float32", (3,), "torch")
    odd = twin.as_device_array(torch.zeros(2, dtype=torch.complex64), "c")
    assert odd.dtype == "complex64"


def test_torch_host_tensors_are_rejected_with_the_same_message():
    torch = pytest.importorskip("torch")
    for t in (torch.zeros(4), torch.nn.Parameter(torch.zeros(4))):
        with pytest.raises(TypeError, match=r"^q must be a CUDA tensor; got a torch tensor on cpu$"):
            arrays.as_device_array(t, "q")
    with pytest.raises(TypeError, match="got a host ndarray"):
        arrays.as_device_array(np.zeros(3), "k")
    with pytest.raises(TypeError, match=r"k must be a GPU array \(CuPy, torch, JAX or DLPack\); got object"):
        arrays.as_device_array(object(), "k")


def test_launch_stream_binds_torchs_getter_once(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1000 + dev, raising=False)
    monkeypatch.setattr(arrays, "_RAW_STREAM", None)
    ref = DeviceArray(BASE, (1,), (1,), "float32", 3, "torch", None)
    assert arrays.launch_stream(ref) == 1003
    assert arrays.launch_stream(ref, 77) == 77
    assert arrays.launch_stream(ref, types.SimpleNamespace(cuda_stream=5)) == 5
    with pytest.raises(TypeError, match="stream must be an int handle"):
        arrays.launch_stream(ref, "s")


def test_empty_like_framework_torch():
    torch = pytest.importorskip("torch")
    ref = DeviceArray(BASE, (1,), (1,), "float32", -1, "torch", torch.zeros(1))
    for name in ("bfloat16", "float32", "bfloat16"):
        o = arrays.empty_like_framework(ref, (2, 3), name)
        assert o.dtype == getattr(torch, name) and tuple(o.shape) == (2, 3)


# ---- kernel launch: parameter buffer and launch configurations ----
class _Driver:
    """A cuLaunchKernelEx stand-in that records each launch's configuration and parameters."""

    def __init__(self, status=0):
        self.calls, self.status = [], status

    def launch(self, config_ref, handle, params, extra):
        assert isinstance(handle, ctypes.c_void_p) and extra is None
        c = config_ref._obj
        self.calls.append(((c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z), c.smem,
                           c.stream or 0, (c.attrs, c.num_attrs), [params[i] for i in range(len(params))]))
        return self.status

    def driver(self):
        return self.launch, lambda code, out: 1


@pytest.fixture
def driver(monkeypatch):
    d = _Driver()
    monkeypatch.setattr(launch, "_driver", d.driver)
    monkeypatch.setattr(launch, "_graph_driver", lambda: None)   # one by one (the graph path: its own tests)
    return d


def _unpack(pointers, args):
    layout, offsets = launch.param_layout(args)
    base = pointers[0] - offsets[0]
    assert [p - base for p in pointers] == list(offsets)
    return layout.unpack(ctypes.string_at(base, layout.size))


def test_launch_packs_every_argument_and_its_geometry(driver):
    k = launch.Kernel(types.SimpleNamespace(ptr=0xabc), "k", 0)
    args = (1 << 40, np.int32(-3), bytes(range(128)), np.float32(0.25), 1.5, np.int64(-7), 5)
    k.launch((3, 2, 1), (128, 1, 1), args, 1024, 0x5000)
    grid, block, smem, stream, attrs, pointers = driver.calls[-1]
    assert (grid, block, smem, stream, attrs) == ((3, 2, 1), (128, 1, 1), 1024, 0x5000, (None, 0))
    assert _unpack(pointers, args) == (1 << 40, -3, bytes(range(128)), 0.25, 1.5, -7, 5)
    assert (pointers[2] - pointers[0]) % 64 == 0   # the tensor map at 64 bytes


def test_launch_configs_are_made_once_and_take_each_calls_stream(driver):
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 0)
    launcher = k.launcher((1,))
    config = launcher.config((2, 1, 1), (32, 1, 1), 0)
    assert launcher.config((2, 1, 1), (32, 1, 1), 0) is config
    assert launcher.config((np.int64(2), 1, 1), (32, 1, 1), 0).grid_x == 2
    for stream in (7, 0, 9):
        launcher(config, (1,), stream)
        assert driver.calls[-1][3] == stream


@pytest.mark.parametrize("grid, block", [((2 ** 31, 1, 1), (32, 1, 1)), ((0, 1, 1), (32, 1, 1)),
                                         ((1, 1), (32, 1, 1)), ((1, 1, 1), (1.5, 1, 1))])
def test_launch_geometry_out_of_range_is_refused_before_the_driver(driver, grid, block):
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 0)
    with pytest.raises((ValueError, TypeError), match="grid and block must be three ints|integer"):
        k.launch(grid, block, (1,), 0, 0)
    assert driver.calls == []


def test_launch_failure_names_the_kernel(monkeypatch):
    d = _Driver(status=700)
    monkeypatch.setattr(launch, "_driver", d.driver)
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "my_kernel", 0)
    with pytest.raises(RuntimeError, match=r"cuLaunchKernelEx\(my_kernel\) failed: 700 \(grid \(1, 1, 1\), "
                                           r"block \(32, 1, 1\), 0 bytes of shared memory\)"):
        k.launch((1, 1, 1), (32, 1, 1), (1,), 0, 0)


def test_parameter_buffer_follows_types_and_struct_lengths(driver):
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 0)
    calls = [(7, bytes(128), np.int32(1)), (7, bytes(range(16)), np.int32(2)), (7, np.int32(3), np.int32(4)),
             (7, bytes(128), np.int32(5)), (7, bytes(range(16)), np.int32(6)), (np.int32(7), 8)]
    for args in calls * 2:
        k.launch((1, 1, 1), (32, 1, 1), args, 0, 0)
        got = _unpack(driver.calls[-1][-1], args)
        assert got == tuple(int(a) if not isinstance(a, bytes) else a for a in args)
    with pytest.raises(TypeError, match="unsupported kernel argument type str"):
        k.launch((1, 1, 1), (32, 1, 1), ("x",), 0, 0)


# ---- bound launches: constants packed once, the call's values read from one buffer ----
def _read(pointers, sig):
    """Each parameter where the driver reads it (`pointers[i]`), by the signature's types."""
    out = []
    for p, t in zip(pointers, sig):
        if type(t) is int:   # a struct of t bytes
            out.append(ctypes.string_at(p, t))
        else:
            code, size = launch._SCALARS[t]
            out.append(struct.unpack("<" + code, ctypes.string_at(p, size))[0])
    return out


def test_bound_launches_read_their_constants_and_the_calls_values(driver):
    sig = (int, np.int32, 128, np.float32, int, 16, np.int64)
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 0)
    launcher = k.launcher_for(sig)
    values = launch.CallValues((int, 128, int))
    at = [launch.PerCall(i) for i in range(3)]
    first = launcher.bind(launcher.config((2, 1, 1), (32, 1, 1), 0), (at[0], np.int32(-3), at[1], np.float32(0.5),
                                                                      at[2], bytes(range(16)), np.int64(9)), values)
    second = launcher.bind(launcher.config((4, 1, 1), (32, 1, 1), 0), (at[2], np.int32(4), at[1], np.float32(1.5),
                                                                       at[0], bytes(16), np.int64(-1)), values)
    for call, stream in ((1, 7), (2, 8)):
        tmap = bytes([call]) * 128
        values.launch((call << 40, tmap, call << 20), (first, second), stream)
        (g1, _, _, s1, _, p1), (g2, _, _, s2, _, p2) = driver.calls[-2:]
        assert (g1, s1, g2, s2) == ((2, 1, 1), stream, (4, 1, 1), stream)
        assert _read(p1, sig) == [call << 40, -3, tmap, 0.5, call << 20, bytes(range(16)), 9]
        assert _read(p2, sig) == [call << 20, 4, tmap, 1.5, call << 40, bytes(16), -1]
    assert launcher.config((2, 1, 1), (32, 1, 1), 0).stream is None   # each bound launch has a config of its own


@pytest.mark.parametrize("args, message", [
    ((launch.PerCall(1), np.int32(1)), r"argument 0 is 128, the kernel takes <class 'int'>"),
    ((launch.PerCall(0), 1), r"argument 1 is <class 'int'>, the kernel takes <class 'numpy.int32'>"),
    ((launch.PerCall(0),), "1 arguments for a kernel of 2"),
])
def test_bound_launch_arguments_must_match_the_signature(args, message):
    launcher = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 0).launcher_for((int, np.int32))
    with pytest.raises(TypeError, match=message):
        launcher.bind(launcher.config((1, 1, 1), (32, 1, 1), 0), args, launch.CallValues((int, 128)))


def test_a_launch_without_a_current_context_is_made_again_within_the_devices(monkeypatch):
    """cuLaunchKernelEx's CUDA_ERROR_INVALID_CONTEXT (a thread that never touched the device):
    the launch is repeated inside `cupy.cuda.Device(kernel.device)`, for plain and bound launches."""
    entered = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)

        def __exit__(self, *exc):
            entered.append("exit")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device)))
    statuses = []

    def driver_launch(config_ref, handle, params, extra):
        statuses.append(201 if not entered or entered[-1] == "exit" else 0)   # 0 inside the device's context
        return statuses[-1]
    monkeypatch.setattr(launch, "_driver", lambda: (driver_launch, lambda code, out: 1))
    monkeypatch.setattr(launch, "_graph_driver", lambda: None)
    k = launch.Kernel(types.SimpleNamespace(ptr=0), "k", 3)
    k.launch((1, 1, 1), (32, 1, 1), (1,), 0, 0)
    launcher = k.launcher_for((int,))
    values = launch.CallValues((int,))
    bound = launcher.bind(launcher.config((1, 1, 1), (32, 1, 1), 0), (launch.PerCall(0),), values)
    values.launch((5,), (bound,), 0)
    assert statuses == [201, 0] * 2 and entered == [3, "exit"] * 2


# ---- a call's launches as one CUDA graph executable per stream ----
class _GraphDriver:
    """The driver's graph entry points, recording: nodes made (params read at creation), the
    parameters each node is given at every call (read where the driver reads them), launches."""

    def __init__(self, sig, capturing=(), fail=()):
        self.sig, self.capturing, self.fail = sig, set(capturing), set(fail)
        self.nodes, self.set, self.launched, self.destroyed, self.handles = [], [], [], [], iter(range(1, 1000))
        self.mode, self.modes_made_in = 0, []   # the thread's capture mode (0: global); the mode at each create

    def _new(self, ref):
        ref._obj.value = next(self.handles)

    def create(self, graph_ref, flags):
        self.modes_made_in.append(self.mode)
        if "create" in self.fail:
            return 999
        self._new(graph_ref)
        return 0

    def add_kernel_node(self, node_ref, graph, deps, ndeps, params_ref):
        p = params_ref._obj
        self._new(node_ref)
        dep = deps._obj.value if ndeps else None
        self.nodes.append((node_ref._obj.value, dep, p.func, (p.grid_x, p.grid_y, p.grid_z), p.block_x, p.smem))
        return 0

    def instantiate(self, exec_ref, graph, flags):
        self._new(exec_ref)
        return 0

    def set_params(self, exe, node, params_ref):
        pointers = ctypes.cast(params_ref._obj.params, ctypes.POINTER(ctypes.c_void_p))
        self.set.append((node.value, _read([pointers[i] for i in range(len(self.sig))], self.sig)))
        return 1 if "set_params" in self.fail else 0

    def launch(self, exe, stream):
        self.launched.append((exe.value, stream))
        return 1 if "launch" in self.fail else 0

    def is_capturing(self, stream, status_ref):
        status_ref._obj.value = int(stream in self.capturing)
        return 0

    def exchange_capture_mode(self, mode_ref):
        self.mode, mode_ref._obj.value = mode_ref._obj.value, self.mode
        return 0

    def destroy_exec(self, exe):
        assert self.mode == 2, "destroyed in relaxed capture mode"
        self.destroyed.append(("exec", exe.value))

    def destroy(self, graph):
        self.destroyed.append(("graph", graph.value))

    def entry_points(self):
        return launch._GraphDriver(self.create, self.add_kernel_node, self.instantiate, self.set_params, self.launch,
                                   self.is_capturing, self.exchange_capture_mode, self.destroy_exec, self.destroy)


def _two_bound_launches(monkeypatch, **graph_kw):
    """A call of two bound launches (grids 2 and 4, one PerCall value each), the plain driver and
    a graph driver, both recording; cupy.cuda.Device stubbed; a graph from the second call."""
    monkeypatch.setattr(launch, "GRAPH_AFTER_CALLS", 1)
    plain = _Driver()
    monkeypatch.setattr(launch, "_driver", plain.driver)
    sig = (int, np.int32)
    graphs = _GraphDriver(sig, **graph_kw)
    monkeypatch.setattr(launch, "_graph_driver", graphs.entry_points)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda i: contextlib.nullcontext())))
    k = launch.Kernel(types.SimpleNamespace(ptr=0xabc), "k", 0)
    launcher = k.launcher_for(sig)
    values = launch.CallValues((int,))
    launches = tuple(launcher.bind(launcher.config((n, 1, 1), (64, 1, 1), 256 * n), (launch.PerCall(0), np.int32(n)),
                                   values) for n in (2, 4))
    return values, launches, plain, graphs


def test_a_calls_second_launch_on_a_stream_goes_as_one_graph_with_that_calls_values(monkeypatch):
    values, launches, plain, graphs = _two_bound_launches(monkeypatch)
    values.launch((10,), launches, 7)
    assert len(plain.calls) == 2 and graphs.nodes == []   # a first call: one by one, no graph made
    for v in (11, 12):
        values.launch((v,), launches, 7)
        assert len(plain.calls) == 2
        assert graphs.set[-2:] == [(graphs.nodes[0][0], [v, 2]), (graphs.nodes[1][0], [v, 4])]
        assert graphs.launched[-1] == (3 + 1, 7)   # handles: graph 1, nodes 2 and 3, the executable 4
    (n1, dep1, f1, g1, b1, s1), (n2, dep2, f2, g2, b2, s2) = graphs.nodes
    assert (dep1, dep2) == (None, n1) and f1 == f2 == 0xabc   # a chain: the second kernel after the first
    assert (g1, g2, b1, s1, s2) == ((2, 1, 1), (4, 1, 1), 64, 512, 1024)
    assert len(graphs.launched) == 2
    assert graphs.modes_made_in == [2] and graphs.mode == 0   # made in relaxed capture mode, then restored
    values.launch((12,), launches, 7)   # the values the nodes hold: launched as they are
    assert len(graphs.set) == 4 and len(graphs.launched) == 3 and len(plain.calls) == 2
    values.launch((11,), launches, 7)
    assert graphs.set[-2:] == [(graphs.nodes[0][0], [11, 2]), (graphs.nodes[1][0], [11, 4])]
    assert len(graphs.launched) == 4


def test_a_graph_whose_parameters_were_refused_sets_them_again_next_call(monkeypatch):
    """A failed cuGraphExecKernelNodeSetParams leaves the nodes' values unknown: that call goes one
    by one, and the next with the same values sets them again before its graph launch."""
    values, launches, plain, graphs = _two_bound_launches(monkeypatch)
    values.launch((1,), launches, 7)
    graphs.fail = {"set_params"}
    values.launch((2,), launches, 7)
    assert graphs.launched == [] and len(plain.calls) == 4
    graphs.fail = set()
    values.launch((2,), launches, 7)
    assert [v for _, v in graphs.set[-2:]] == [[2, 2], [2, 4]] and len(graphs.launched) == 1


def test_each_stream_gets_a_graph_of_its_own_and_a_captured_stream_launches_one_by_one(monkeypatch):
    """A stream being captured records plain kernel launches and gets no graph made (torch's
    captures run on one stream, capture after capture), neither for its first calls nor after
    a graph was made for it: both launch one by one until the capture ends."""
    values, launches, plain, graphs = _two_bound_launches(monkeypatch, capturing={9})
    for stream in (7, 8, 7, 8, 9, 9, 9):
        values.launch((stream,), launches, stream)
    assert [s for _, s in graphs.launched] == [7, 8]   # the second call of each of 7 and 8
    assert [c[3] for c in plain.calls] == [7, 7, 8, 8] + [9] * 6   # 9 is being captured: its calls stay kernels
    assert len(graphs.nodes) == 4   # graphs for 7 and 8 only
    graphs.capturing = {7}   # a capture on 7 after its graph was made
    values.launch((7,), launches, 7)
    graphs.capturing = set()   # 9's capture ended: its next call makes its graph
    values.launch((9,), launches, 9)
    assert [s for _, s in graphs.launched] == [7, 8, 9] and [c[3] for c in plain.calls[-2:]] == [7, 7]


def test_a_graph_is_made_only_after_many_calls(monkeypatch):
    after = launch.GRAPH_AFTER_CALLS
    values, launches, plain, graphs = _two_bound_launches(monkeypatch)
    monkeypatch.setattr(launch, "GRAPH_AFTER_CALLS", after)
    for v in range(after + 2):
        values.launch((v,), launches, 7)
    assert after >= 4 and len(plain.calls) == 2 * after and len(graphs.launched) == 2


def test_a_single_launch_stays_a_kernel_launch(monkeypatch):
    values, launches, plain, graphs = _two_bound_launches(monkeypatch)
    for v in range(3):
        values.launch((v,), launches[:1], 7)
    assert len(plain.calls) == 3 and graphs.nodes == [] and values.graphs == {}


def test_a_graph_the_driver_will_not_make_is_not_asked_for_again(monkeypatch):
    values, launches, plain, graphs = _two_bound_launches(monkeypatch, fail={"create"})
    for v in range(4):
        values.launch((v,), launches, 7)
    assert len(plain.calls) == 8 and graphs.launched == [] and values.graphs == {(7, launches): launch.NO_GRAPH}


def test_a_refused_graph_launch_launches_one_by_one(monkeypatch):
    values, launches, plain, graphs = _two_bound_launches(monkeypatch, fail={"launch"})
    values.launch((1,), launches, 7)
    values.launch((2,), launches, 7)
    assert len(graphs.launched) == 1 and len(plain.calls) == 4
    assert _read(plain.calls[-1][-1], (int, np.int32)) == [2, 4]


def test_graphs_per_call_are_capped_and_freed_with_it(monkeypatch):
    values, launches, plain, graphs = _two_bound_launches(monkeypatch)
    for stream in range(launch.GRAPH_STREAMS + 3):
        values.launch((stream,), launches, stream)
        values.launch((stream,), launches, stream)
    assert len(values.graphs) == launch.GRAPH_STREAMS and len(graphs.launched) == launch.GRAPH_STREAMS
    assert len(plain.calls) == 2 * launch.GRAPH_STREAMS + 4 * 3
    values.graphs.clear()
    assert graphs.mode == 0
    assert sorted(graphs.destroyed) == sorted([("exec", 4 + 4 * i) for i in range(launch.GRAPH_STREAMS)]
                                              + [("graph", 1 + 4 * i) for i in range(launch.GRAPH_STREAMS)])


def test_graph_launches_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("PYKDA_GRAPH_LAUNCH", "0")
    launch._graph_driver.cache_clear()
    try:
        assert launch._graph_driver() is None
    finally:
        launch._graph_driver.cache_clear()
