"""Install paths (issue 14): each CUDA extra brings one CuPy and its NVRTC wheel, `test` brings
none, and CI runs the README's test command as written there."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")   # Python >= 3.11

WHEELS = {"cuda12": ("cupy-cuda12x", "nvidia-cuda-nvrtc-cu12"), "cuda13": ("cupy-cuda13x", "nvidia-cuda-nvrtc")}


def _extras():
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def _names(requirements):
    return [re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in requirements]


def _readme_commands():
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()
            if line.startswith("pip install")]


@pytest.mark.parametrize("extra", sorted(WHEELS))
def test_a_cuda_extra_brings_one_cupy_and_its_nvrtc(extra):
    names = _names(_extras()[extra])
    cupy, nvrtc = WHEELS[extra]
    assert [n for n in names if n.startswith("cupy")] == [cupy]
    assert [n for n in names if n.startswith("nvidia-")] == [nvrtc]


def test_the_other_extras_bring_no_cupy():
    for extra, requirements in _extras().items():
        if extra not in WHEELS:
            assert not [n for n in _names(requirements) if n.startswith(("cupy", "nvidia-"))], extra


def test_readme_shows_both_installs_and_ci_runs_its_test_command_as_written():
    commands = _readme_commands()
    for extra in WHEELS:
        assert f'pip install ".[{extra}]" && python -m pykda demo' in commands
    (test_command,) = [c for c in commands if "pytest" in c]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines


def test_every_python_package_of_the_tree_is_installed():
    """setuptools installs the packages pyproject.toml lists: each folder of pykda/ holding an
    __init__.py must be among them (else `pip install .` ships a pykda without it)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "pykda").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
