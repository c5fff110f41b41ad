"""Every registered specialization renders and compiles offline to an sm_90a cubin."""
import pytest

from pykda import registry, runtime

SPECS = registry.specs(None, "sm_90a")


@pytest.mark.parametrize("spec", SPECS, ids=[f"{s.template}:{s.describe()}" for s in SPECS])
def test_specialization_compiles(spec):
    src = runtime.render(spec.template, spec.param_dict)
    cubin = runtime.compile_cubin(src, spec.arch, name=f"{spec.template}.cu")
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
