"""Every registered specialization renders and compiles offline to an sm_90a cubin."""
import pytest

from pykda import registry, runtime

SPECS = registry.specs(None, "sm_90a")

# The registered kernels that keep a stack frame (`ptxas -v`'s "bytes stack frame": spilled
# registers), by template and parameters, with the most bytes they may keep there (NVRTC 12.9 and
# 13.0 alike). Every other kernel keeps everything in registers: a template change that spills
# shows here, and a new entry is a decision, not an accident.
STACK_FRAMES = (
    ("decode", lambda p: p["D"] == 256 and p["BALANCED"] and not p["TRANSPOSED"], 16),   # 255 registers
    ("decode", lambda p: p["D"] == 256 and p["BALANCED"] and not p["TRANSPOSED"] and p["GATHER"],
     24),   # and gathering small pages: the producer's row places (64-bit) take 8 bytes more
    ("decode", lambda p: p["D"] == 64 and p["STAGES"] == 1 and p["BLOCK_N"] == 64, 8),   # one value, 72-80 registers
    ("decode", lambda p: p["D"] == 64 and p.get("PADDED_BOX_ROWS") and p["BLOCK_N"] == 128 and not p["TRANSPOSED"],
     8),   # in boxes: one value at 96 registers (102 and none in whole tiles)
    ("kda_decode", lambda p: (p["SPEC"] or p["VERIFY"]) and p["STATE"] == "float" and p["RPT"] == 8
     and p["MIN_CTAS"] == 3, 32),   # speculative steps of fp32 states, 128 registers for three CTAs an SM
    ("kda_prepare", lambda p: p["K"] == 128, 16),   # 80 registers for six CTAs an SM (168 at C = 32)
    ("kda_scan", lambda p: p["MODE"] == "group_walk" and p["K"] == 128, 8),
    ("kda_recurrence", lambda p: p["C"] == 32, 80),   # chunks of 32 (not the planner's default)
    ("kda_recurrence", lambda p: p["CKPT"], 8),
)


def stack_bytes_allowed(spec) -> int:
    """The most stack bytes a kernel of `spec` may keep (STACK_FRAMES; 0 for any other)."""
    return max((most for template, matches, most in STACK_FRAMES
                if template == spec.template and matches(spec.param_dict)), default=0)


@pytest.fixture(scope="module")
def compiled_ahead(request):
    """The selected specs compiled into the disk cache on several threads
    (`runtime.compile_specs`), so that each test below finds its cubin there (an entry is named by
    its exact source and NVRTC version: found means NVRTC compiled that source). A failure stops
    the warm-up only: the failing spec's own test compiles it again and shows NVRTC's log."""
    selected = [item.callspec.params["spec"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_specialization_compiles"]
    try:
        for _ in runtime.compile_specs(selected):
            pass
    except runtime.CompileError:
        pass


@pytest.mark.parametrize("spec", SPECS, ids=[f"{s.template}:{s.describe()}" for s in SPECS])
def test_specialization_compiles(spec, compiled_ahead):
    """The spec's cubin, and no kernel in it spilling beyond what STACK_FRAMES allows."""
    cubin, _, _ = runtime.compile_spec(spec)
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
    allowed = stack_bytes_allowed(spec)
    for name, used in runtime.kernel_resources(cubin).items():
        assert used.stack_bytes <= allowed, f"{name} keeps {used.stack_bytes} B a thread on the stack " \
                                            f"({used.registers} registers); STACK_FRAMES allows {allowed}"


# The registered wgmma kernels that ptxas serializes (every wgmma then waits for the one before:
# "Potential Performance Loss", C7511 and kin), by template and parameters: a template change that
# serializes another shows here. kda_recurrence's 8-warp walk of a rank's slice and its 4-warp walk
# with fla's state layout (segment passes of 4 warps): "insufficient register resources for the
# wgmma pipeline" (docs/studies/kda_one_product/kd_folded.patch unserializes both, and runs slower).
SERIALIZED_WGMMA = (
    ("kda_recurrence", lambda p: not p["MAP"] and p["RANK"] and p["WARPS"] == 8),
    ("kda_recurrence", lambda p: not p["MAP"] and not p["RANK"] and p["WARPS"] == 4 and not p["VFIRST"]),
)
# the registered wgmma kernels, each with both state layouts (the registry holds fla's K-first one
# for most shapes; the bench and V-first callers take the other)
WGMMA_SPECS = list(dict.fromkeys(runtime.KernelSpec.make(s.template, {**s.param_dict, "VFIRST": v_first}, s.arch)
                                 for s in SPECS if s.param_dict.get("WGMMA") for v_first in (False, True)))


@pytest.mark.parametrize("spec", WGMMA_SPECS, ids=[f"{s.template}:{s.describe()}" for s in WGMMA_SPECS])
def test_wgmma_kernels_are_not_serialized_by_ptxas(spec):
    """ptxas's report of each registered wgmma kernel, in either state layout: no serialization
    note (C75xx) but where SERIALIZED_WGMMA expects one."""
    report = runtime.ptxas_report(runtime.render(spec.template, spec.param_dict), spec.arch)
    expected = any(template == spec.template and matches(spec.param_dict) for template, matches in SERIALIZED_WGMMA)
    assert ("Potential Performance Loss" in report) == expected, report


def test_compile_cli_takes_every_registered_family_and_names_an_unknown_one(capsys):
    """`python -m pykda compile --family`: the choices are the registry's families (kda
    included), and an unknown one is argparse's usage error naming the option, not a traceback."""
    from pykda.__main__ import build_parser
    parse = build_parser().parse_args
    for family in registry.FAMILIES:
        assert parse(["compile", "--family", family]).family == family
    assert parse(["compile"]).family is None and parse(["compile"]).jobs is None
    assert parse(["compile", "--jobs", "3"]).jobs == 3
    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exc:
            parse(["compile", "--jobs", bad])
        assert exc.value.code == 2 and f"{bad!r} is not a count of at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        parse(["compile", "--family", "bogus"])
    assert exc.value.code == 2 and "--family" in capsys.readouterr().err
    help_text = next(a.help for a in build_parser()._subparsers._group_actions[0].choices["compile"]._actions
                     if a.dest == "family")
    assert all(family in help_text for family in registry.FAMILIES)


def test_compile_cli_prints_each_kernels_registers_and_a_summary(monkeypatch, capsys):
    """A line per spec with its kernels' registers (and stack bytes where any), then the count by
    source and of the kernels that spill; the jobs reach compile_specs."""
    from pykda.__main__ import main
    specs = registry.specs("kda", "sm_90a")[:2]
    seen = {}

    def compile_specs(given, jobs):
        seen["jobs"] = jobs
        return ((spec, b"cubin %d" % i, 0.5, i == 1) for i, spec in enumerate(given))
    resources = {b"cubin 0": {"kda_prepare": runtime.KernelResources(80, 16, 1024)},
                 b"cubin 1": {"kda_prepare": runtime.KernelResources(72, 0, 1024)}}
    monkeypatch.setattr(registry, "specs", lambda family, arch: specs)
    monkeypatch.setattr(runtime, "compile_specs", compile_specs)
    monkeypatch.setattr(runtime, "kernel_resources", lambda cubin: resources[cubin])
    assert main(["compile", "--family", "kda", "--jobs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert seen["jobs"] == 3 and len(lines) == 3
    assert lines[0].endswith("(nvrtc)  kda_prepare 80 regs 16 B stack") and lines[1].endswith("(disk)  kda_prepare 72 regs")
    assert lines[2].startswith("2 specializations (1 by NVRTC, 1 from the disk cache) in ")
    assert lines[2].endswith("s; kernels with a stack frame: 1")


def test_render_cli_names_a_parameter_that_is_not_key_value(capsys):
    """`python -m pykda render decode D128`: argparse's usage error naming the parameter, not
    dict()'s 'dictionary update sequence element' ValueError."""
    from pykda.__main__ import build_parser
    parse = build_parser().parse_args
    assert parse(["render", "decode", "D=128", "SPLIT=True", "X=a=b"]).params == [("D", "128"), ("SPLIT", "True"),
                                                                                  ("X", "a=b")]
    for bad in ("D128", "=128"):
        with pytest.raises(SystemExit) as exc:
            parse(["render", "decode", bad])
        assert exc.value.code == 2 and f"{bad!r} is not KEY=VALUE" in capsys.readouterr().err
