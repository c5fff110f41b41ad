"""The registered kda kernels compiled by the NVRTC this process loads, stored under the cache names
that NVRTC 13.0 gives them (a device whose NVRTC is 13.0 then loads them as its own). Session 46:
`pip install --no-deps --target /tmp/nvrtc135 nvidia-cuda-nvrtc==13.5.37`, then
`LD_PRELOAD=/tmp/nvrtc135/nvidia/cu13/lib/libnvrtc.so.13 PYKDA_CACHE_DIR=.kc_135 python mk135.py`."""
from pykda import registry, runtime
from pykda.runtime import cache, compile as comp

print("nvrtc", comp.nvrtc_version())
cache.nvrtc_version = lambda: (13, 0)   # the entries' names only: NVRTC itself compiles
compiled = sum(1 for _, _, _, from_disk in runtime.compile_specs(registry.specs("kda", "sm_90a")) if not from_disk)
print(compiled, "compiled into", cache.cache_dir())
