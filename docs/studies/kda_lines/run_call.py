"""Two chunk_kda calls (softplus gate, no states), every kernel compiled with -lineinfo (a separate
cache entry: the options are part of its key). With --out, also writes the rendered source and the
cubin of one of the call's kernels there (kernel.cu, kernel.cubin) for lines.py.

    python run_call.py H T [--out DIR --template kda_prepare --where MAP=True]"""
import argparse
from pathlib import Path

import torch

import pykda
from pykda.bench.kda import FLAGS, _inputs
from pykda.runtime import cache, compile as nvrtc_compile
from pykda.runtime.render import render

ap = argparse.ArgumentParser()
ap.add_argument("H", type=int)
ap.add_argument("T", type=int)
ap.add_argument("--out")
ap.add_argument("--template", default="kda_prepare")
ap.add_argument("--where", default="", help="NAME=VALUE a template parameter of the kernel must have")
a = ap.parse_args()

nvrtc_compile.BASE_OPTIONS = nvrtc_compile.BASE_OPTIONS + ("-lineinfo",)
built = []
_compile_spec = cache.compile_spec
cache.compile_spec = lambda spec: (built.append(spec), _compile_spec(spec))[1]

x, params, cu, _ = _inputs(a.H, [a.T], False)
seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
for _ in range(2):
    pykda.chunk_kda(*seq, **params, **FLAGS["softplus"], state_v_first=True)
torch.cuda.synchronize()
if a.out:
    name, _, value = a.where.partition("=")
    spec = next(s for s in built if s.template == a.template and (not name or str(s.param_dict[name]) == value))
    Path(a.out, "kernel.cu").write_text(render(spec.template, spec.param_dict))
    Path(a.out, "kernel.cubin").write_bytes(_compile_spec(spec)[0])
    print(spec.template, spec.param_dict)
