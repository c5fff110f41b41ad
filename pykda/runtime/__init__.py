"""The JIT runtime: spec -> render -> NVRTC compile -> cache -> load -> launch.

It knows nothing of attention: kernels are Jinja templates with parameters, arrays are
pointers with shapes, tensor maps are boxes over strided memory.
"""
from .spec import KernelSpec
from .render import render
from .compile import CompileError, KernelResources, compile_cubin, kernel_resources, nvrtc_version, ptxas_report
from .cache import get_kernel, load_specs, compile_spec, compile_specs, cache_dir
from .device import DeviceInfo, UnsupportedDevice, device_info, require_gpu, gpu_available
from .launch import BoundLaunch, CallValues, Kernel, LaunchConfig, Launcher, PerCall, param_layout, signature
from .tensormap import TensorMapError, TiledMaps, encode_tiled, check_tiled
from .workspace import workspace

__all__ = [
    "KernelSpec", "render", "CompileError", "KernelResources", "compile_cubin", "kernel_resources", "nvrtc_version",
    "ptxas_report", "get_kernel", "load_specs",
    "compile_spec", "compile_specs", "cache_dir", "DeviceInfo", "UnsupportedDevice", "device_info", "require_gpu",
    "gpu_available",
    "BoundLaunch", "CallValues", "Kernel", "LaunchConfig", "Launcher", "PerCall", "param_layout", "signature",
    "TensorMapError", "TiledMaps", "encode_tiled", "check_tiled", "workspace",
]
