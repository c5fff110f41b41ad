"""CPU tests of the workspace: which allocator a call's scratch comes from (torch's caching
allocator for torch arrays, CuPy's for CuPy arrays, a pykda buffer per (device, stream) for the
rest), the stream it is taken for and bad sizes. (A split flash decoding call's one workspace:
test_batch_decode_checks.) torch and CuPy are stand-ins: no GPU needed."""
import importlib
import sys
import types
from contextlib import contextmanager

import pytest

from pykda.runtime import arrays
from pykda.runtime.arrays import DeviceArray
from fakes import BASE

ws = importlib.import_module("pykda.runtime.workspace")   # the module (runtime.workspace is its function)


class FakeTensor:
    """A torch tensor as torch_scratch sees it."""

    def __init__(self, device=0):
        self.device, self.made, self.recorded = device, [], []

    def get_device(self):
        return self.device

    def new_empty(self, *size, dtype=None):   # torch's sizes as separate ints
        buf = FakeTensor(self.device)
        buf.shape, buf.dtype = size, dtype
        self.made.append(buf)
        return buf

    def data_ptr(self):
        return BASE * 5

    def record_stream(self, stream):
        self.recorded.append(stream)


class FakeCupyArray:
    __module__ = "cupy._core.core"


class FakeCupy:
    """cupy.cuda as the workspace uses it: devices, streams, the pool's alloc, Memory."""

    def __init__(self):
        self.device, self.stream, self.log = 0, 1000, []
        outer = self

        @contextmanager
        def device(i):
            before, outer.device = outer.device, i
            yield
            outer.device = before

        @contextmanager
        def external_stream(ptr):
            before, outer.stream = outer.stream, ptr
            yield
            outer.stream = before

        class Memory:
            def __init__(self, size):
                self.size, self.ptr = size, BASE * (len(outer.log) + 1)
                outer.log.append(("Memory", outer.device, size))

        def alloc(n):
            outer.log.append(("alloc", outer.device, outer.stream, n))
            return types.SimpleNamespace(ptr=BASE * 6)

        self.cuda = types.SimpleNamespace(
            Device=device, ExternalStream=external_stream, Memory=Memory, alloc=alloc,
            get_current_stream=lambda: types.SimpleNamespace(ptr=outer.stream))


@pytest.fixture
def cupy(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(ws, "_owned", {})
    return fake


@pytest.fixture
def torch_scratch(monkeypatch):
    """Records the torch allocations the workspace asks for; returns (log, owner)."""
    log = []

    def scratch(t, nbytes, stream):
        log.append((t, nbytes, stream))
        return "torch block", BASE * 7
    monkeypatch.setattr(ws, "torch_scratch", scratch)
    monkeypatch.setattr(ws, "is_torch_tensor", lambda x: type(x) is FakeTensor)
    return log


def test_torch_arrays_take_torch_allocator_and_no_pykda_buffer(cupy, torch_scratch):
    t = FakeTensor()
    assert ws.workspace(t, 5, 4096) == ("torch block", BASE * 7)
    view = DeviceArray(BASE, (4,), (1,), "bfloat16", 0, "torch", t)   # as the prefill op holds it
    assert ws.workspace(view, 6, 100) == ("torch block", BASE * 7)
    assert torch_scratch == [(t, 4096, 5), (t, 100, 6)]
    assert ws._owned == {} and cupy.log == []


def test_cupy_arrays_take_cupy_allocator_with_the_launch_stream_current(cupy, torch_scratch):
    a = DeviceArray(BASE, (4,), (1,), "float16", 1, "cupy", FakeCupyArray())
    owner, ptr = ws.workspace(a, 1000, 64)   # CuPy's current stream: taken as it is
    assert ptr == owner.ptr == BASE * 6
    ws.workspace(a, 42, 128)                 # another stream: made current for the allocation
    assert cupy.log == [("alloc", 1, 1000, 64), ("alloc", 1, 42, 128)]
    assert cupy.stream == 1000 and cupy.device == 0, "the caller's stream and device are restored"
    assert torch_scratch == [] and ws._owned == {}


def test_other_arrays_take_a_pykda_buffer_per_device_and_stream(cupy, torch_scratch):
    jax_like = DeviceArray(BASE, (4,), (1,), "bfloat16", 0, "cupy", object())   # a DLPack producer's view
    first, p1 = ws.workspace(jax_like, 9, 1000)
    again, p2 = ws.workspace(jax_like, 9, 1 << 20)
    assert again is first and p2 == p1 == first.ptr, "reused on its stream while large enough"
    other, _ = ws.workspace(jax_like, 10, 1000)
    assert other is not first, "never shared across streams"
    grown, _ = ws.workspace(jax_like, 9, (1 << 20) + 1)
    assert grown is not first and grown.size == 2 << 20, "grows by doubling"
    assert [e[:2] for e in cupy.log] == [("Memory", 0)] * 3
    assert torch_scratch == []


@pytest.mark.parametrize("nbytes", [0, -8])
def test_bad_sizes_raise(cupy, torch_scratch, nbytes):
    with pytest.raises(ValueError, match=rf"workspace: nbytes must be positive; got nbytes={nbytes}$"):
        ws.workspace(FakeTensor(), 1, nbytes)
    assert torch_scratch == [] and cupy.log == []


def test_torch_scratch_is_a_byte_tensor_recorded_on_a_launch_stream_not_current(monkeypatch):
    """Where torch has no raw blocks (a CPU build): a uint8 tensor."""
    streams = []
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        ExternalStream=lambda handle, device: streams.append((handle, device)) or ("stream", handle)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(arrays, "_RAW_BLOCKS", ())
    monkeypatch.setattr(arrays, "_TORCH_BY_NAME", {"uint8": "torch.uint8"})
    monkeypatch.setattr(arrays, "_RAW_STREAM", lambda device: 500 + device)   # torch's current stream
    t = FakeTensor(device=2)
    buf, ptr = arrays.torch_scratch(t, 4096, 502)
    assert (buf.shape, buf.dtype, ptr) == ((4096,), "torch.uint8", BASE * 5)
    assert buf.recorded == [] and streams == [], "on torch's current stream: stream-ordered already"
    buf, _ = arrays.torch_scratch(t, 64, 77)
    assert streams == [(77, 2)] and buf.recorded == [("stream", 77)]


def test_torch_scratch_is_a_raw_block_for_the_launch_stream_given_back_when_dropped(monkeypatch):
    """With t's device current, a block of torch's allocator taken for the launch stream itself
    (no tensor, no record_stream) and freed when its owner goes; on another device, a tensor."""
    log = []
    current = {"device": 2}
    fake_c = types.SimpleNamespace(
        _cuda_getDevice=lambda: current["device"],
        _cuda_cudaCachingAllocator_raw_alloc=lambda n, stream: log.append(("alloc", n, stream)) or BASE * 9,
        _cuda_cudaCachingAllocator_raw_delete=lambda ptr: log.append(("free", ptr)))
    fake_torch = types.SimpleNamespace(_C=fake_c, cuda=types.SimpleNamespace(
        ExternalStream=lambda handle, device: ("stream", handle)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(arrays, "_RAW_BLOCKS", ())
    monkeypatch.setattr(arrays, "_TORCH_BY_NAME", {"uint8": "torch.uint8"})
    monkeypatch.setattr(arrays, "_RAW_STREAM", lambda device: 500 + device)
    t = FakeTensor(device=2)
    owner, ptr = arrays.torch_scratch(t, 4096, 77)
    assert ptr == BASE * 9 and log == [("alloc", 4096, 77)] and t.made == []
    del owner
    assert log == [("alloc", 4096, 77), ("free", BASE * 9)]
    current["device"] = 0   # t's device is not the current one: the tensor path
    buf, ptr = arrays.torch_scratch(t, 64, 77)
    assert t.made == [buf] and buf.recorded == [("stream", 77)] and len(log) == 2
