"""Stand-ins for device arrays and compiled kernels, for CPU tests of argument checks and launch
sequences (the pointers are never used)."""
import numpy as np

from pykda.runtime.arrays import DeviceArray, contiguous_strides
from pykda.runtime.launch import PerCall, param_layout, signature

BASE = 1 << 30   # a 16-byte aligned fake address


def device_array(shape, dtype="bfloat16", strides=None, ptr=BASE, device=0) -> DeviceArray:
    """A DeviceArray of `shape`, contiguous unless `strides` (in elements) are given."""
    if strides is None:
        strides = contiguous_strides(tuple(shape))
    return DeviceArray(ptr, tuple(shape), tuple(strides), dtype, device, "test", None)


class FakeKernel:
    """A compiled kernel's stand-in (what `runtime.get_kernel` returns): its launchers record every
    launch in `log` as (name, grid, block, smem, args, spec), each argument checked against the
    launcher's signature and given a kernel parameter type."""

    def __init__(self, name, spec, log):
        self.name, self.spec, self.log = name, spec, log

    def launch(self, grid, block, args, smem, stream):
        """An unbound launch (Kernel.launch), logged as a launcher's."""
        launcher = self.launcher_for(signature(args))
        launcher(launcher.config(grid, block, smem), args, stream)

    def launcher_for(self, sig):
        kernel = self

        class Launcher:
            def config(self, grid, block, smem):
                return grid, block, smem

            def __call__(self, config, args, stream):
                assert signature(args) == sig
                param_layout(args)
                kernel.log.append((kernel.name, *config, args, kernel.spec))

            def bind(self, config, args, values):
                """A bound launch logging as the launcher does, with the call's values (read back
                from their buffer, in their types) in place of the PerCall arguments."""
                launcher = self

                def bound(stream):
                    packed = values.layout.unpack_from(values.buffer)
                    now = [t(v) if t in (np.int32, np.int64) else v for v, t in zip(packed, values.sig)]
                    launcher(config, tuple(now[a.index] if type(a) is PerCall else a for a in args), stream)
                return bound
        return Launcher()


def offline_runtime(monkeypatch, launches: list, workspace, maps: list | None = None) -> None:
    """Patch the runtime so that ops run their whole launch path without a GPU: a fake H200,
    FakeKernels recording into `launches`, `workspace(ref, stream, nbytes)` for scratch
    memory, tensor maps checked (and logged into `maps` as (name, dims, strides, box)) but not
    encoded, outputs as fake device arrays at BASE * 2."""
    from pykda import runtime
    from pykda.runtime import arrays, tensormap
    from pykda.runtime.device import DeviceInfo
    info = DeviceInfo(0, "fake H200", (9, 0), 132, 232448, 233472, 60 << 20)

    def encode_tiled(name, dtype, ptr, dims, strides, box, swizzle=0, l2_promotion=0):
        runtime.check_tiled(name, dtype, ptr, dims, strides, box, swizzle, l2_promotion)
        if maps is not None:
            maps.append((name, dims, strides, box))
        return bytes(128)
    monkeypatch.setattr(runtime, "require_gpu", lambda: None)
    monkeypatch.setattr(runtime, "device_info", lambda i: info)
    monkeypatch.setattr(runtime, "workspace", workspace)
    monkeypatch.setattr(runtime, "get_kernel", lambda spec, dev, name: FakeKernel(name, spec, launches))
    monkeypatch.setattr(runtime, "load_specs", lambda specs, dev, jobs=None: None)   # nothing to compile or load
    monkeypatch.setattr(tensormap, "encode_tiled", encode_tiled)   # what TiledMaps calls
    monkeypatch.setattr(arrays, "launch_stream", lambda ref, stream=None: 0)
    monkeypatch.setattr(arrays, "to_framework", lambda ref, x: x)
    monkeypatch.setattr(arrays, "empty_like_framework", lambda ref, shape, dtype: device_array(shape, dtype, ptr=BASE * 2))
