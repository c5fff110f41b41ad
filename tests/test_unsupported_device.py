"""Every op on a GPU pykda's kernels are not written for (anything but compute capability 9.0)
raises UnsupportedDevice naming the device, before any kernel is compiled or launched (CPU: the
offline runtime of tests/fakes.py with the device's facts replaced)."""
import pytest

import pykda
from pykda import runtime
from pykda.ops import decode, kda, kda_decode, paged_decode
from pykda.ops.kda_variant import SAFE_GATE_FLAGS
from pykda.runtime import arrays
from pykda.runtime.device import KERNEL_TARGETS, DeviceInfo, UnsupportedDevice
from fakes import device_array as arr, offline_runtime

H, K = 4, 128
PREPARED = (kda.PREPARED, kda_decode.PREPARED, decode.PREPARED, paged_decode.PREPARED)   # calls prepared before
GPUS = {(8, 0): "NVIDIA A100-SXM4-80GB", (8, 9): "NVIDIA L40S", (10, 0): "NVIDIA B200", (12, 0): "NVIDIA RTX PRO 6000"}


def test_hopper_is_the_only_target():
    assert DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 232448, 233472, 60 << 20).arch == "sm_90a"
    assert set(KERNEL_TARGETS) == {(9, 0)}


@pytest.mark.parametrize("capability", sorted(GPUS))
def test_other_gpus_are_named(capability):
    info = DeviceInfo(1, GPUS[capability], capability, 100, 100000, 100000, 1 << 20)
    with pytest.raises(UnsupportedDevice, match=rf"device 1 \({GPUS[capability]}\) has compute capability "
                                               rf"{capability[0]}\.{capability[1]}"):
        info.arch
    assert issubclass(UnsupportedDevice, ValueError)


@pytest.fixture(params=sorted(GPUS))
def other_gpu(request, monkeypatch):
    """The offline runtime on a device of another compute capability; the launches it records."""
    launches, compiled = [], []
    offline_runtime(monkeypatch, launches, lambda ref, stream, nbytes: (object(), 1 << 40))
    info = DeviceInfo(0, GPUS[request.param], request.param, 132, 232448, 233472, 60 << 20)
    monkeypatch.setattr(runtime, "device_info", lambda i: info)
    monkeypatch.setattr(runtime, "load_specs", lambda specs, dev, jobs=None: compiled.append(specs))
    monkeypatch.setattr(runtime, "get_kernel", lambda spec, dev, name: compiled.append(spec))
    monkeypatch.setattr(arrays, "copy_from_host", lambda ptr, host, dev, stream: None)   # a paged plan's table
    for prepared in PREPARED:
        prepared.clear()
    yield launches, compiled
    for prepared in PREPARED:
        prepared.clear()


def _prefill():
    T = 40
    return pykda.chunk_kda(arr((1, T, H, K)), arr((1, T, H, K)), arr((1, T, H, K)), arr((1, T, H, K)),
                           arr((1, T, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
                           **SAFE_GATE_FLAGS._asdict(), state_v_first=True)


def _decode_step():
    N, P = 3, 8
    return pykda.fused_recurrent_kda(arr((N, 1, H, K)), arr((N, 1, H, K)), arr((N, 1, H, K)), arr((N, 1, H, K)),
                                     arr((N, 1, H)), A_log=arr((H,), "float32"), dt_bias=arr((H, K), "float32"),
                                     **SAFE_GATE_FLAGS._asdict(), state_v_first=True,
                                     initial_state=arr((P, H, K, K), "float32"), state_indices=arr((N,), "int32"))


def _single():
    return pykda.single_decode_with_kv_cache(arr((32, K)), arr((1000, 8, K)), arr((1000, 8, K)))


def _batch():
    return pykda.batch_decode_with_padded_kv_cache(arr((3, 32, K)), arr((3, 100, 8, K)), arr((3, 100, 8, K)))


def _paged():
    import numpy as np
    dec = paged_decode.BatchDecodeWithPagedKVCache("NHD")
    dec.plan(np.array([0, 2, 3], np.int32), arr((3,), "int32"), np.array([16, 5], np.int32), 32, 8, K, 16)
    return dec.run(arr((2, 32, K)), arr((10, 16, 8, K)), arr((10, 16, 8, K)))


@pytest.mark.parametrize("call", [_prefill, _decode_step, _single, _batch, _paged])
def test_every_op_refuses_before_compiling_or_launching(other_gpu, call):
    launches, compiled = other_gpu
    with pytest.raises(UnsupportedDevice, match="pykda's kernels run on Hopper GPUs"):
        call()
    assert not launches and not compiled
