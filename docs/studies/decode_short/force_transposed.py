"""A pytest plugin for transposed.patch: every decode kernel of a group of at most 8 query heads is
built with TRANSPOSED = 1, so the decode GPU tests (float64 references, awkward lengths, pages,
splits, clusters, the balanced split, graphs) check it. With the patch applied, from the
repository root:
    PYTHONPATH=docs/studies/decode_short:. python -m pytest -p force_transposed -m gpu tests/test_decode_gpu.py ...
"""
import functools

from pykda import runtime
from pykda.ops import decode

_decode_spec = decode.decode_spec


@functools.lru_cache(maxsize=1024)
def transposed_spec(p, plan, arch, page_size=0):
    spec = _decode_spec(p, plan, arch, page_size)
    if p.group > 8:
        return spec
    return runtime.KernelSpec.make(spec.template, {**spec.param_dict, "TRANSPOSED": 1}, arch, spec.kernels)


decode.decode_spec = transposed_spec
