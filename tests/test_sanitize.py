"""CPU tests of `python -m pykda sanitize`: reading compute-sanitizer logs (fake ones, in the
formats the tools print; any report of any tool fails, kda_recurrence's racecheck reports too),
the command lines, the missing-tool error, a whole run against a fake compute-sanitizer, and the test ids themselves
(collected by pytest, so a renamed GPU test fails here)."""
import importlib.util
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pykda import sanitize
from pykda.__main__ import main as cli_main

ROOT = Path(__file__).resolve().parent.parent

PASSED = "....................................                                     [100%]\n36 passed in 412.07s (0:06:52)\n"

CLEAN_MEMCHECK = "========= COMPUTE-SANITIZER\n" + PASSED + "========= ERROR SUMMARY: 0 errors\n"

# racecheck's reports of the shipped kda_recurrence (one arrive per warp), which the PYKDA_SANITIZE
# build no longer gives: the one-line form, and the form that breaks after "at"
RACE_KDA = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at kda_recurrence+0x2b30
=========     and Read access at kda_recurrence+0x1f40 [6944 hazards]
=========     and Read access at kda_recurrence+0x1f80 [6944 hazards]
=========
========= Error: Race reported between Write access at
=========     kda_recurrence+0x2b30
=========     and Read access at
=========     kda_recurrence+0x2210
=========     [1736 hazards]
=========
"""


def racecheck_log(reports, n, passed=PASSED):
    return reports + passed + f"========= RACECHECK SUMMARY: {n} hazard{'s' if n != 1 else ''} displayed ({n} error{'s' if n != 1 else ''}, 0 warnings)\n"


def memcheck_report(kernel, offset):
    return textwrap.dedent(f"""\
        ========= Invalid __global__ read of size 16 bytes
        =========     at {kernel}+0x{offset:x}
        =========     by thread (3,0,0) in block (7,1,0)
        =========     Address 0x7f1e2c000400 is out of bounds
        =========     and is 1,024 bytes after the nearest allocation at 0x7f1e2bf00000 of size 1,048,576 bytes
        =========     Saved host backtrace up to driver entry point at kernel launch time
        =========         Host Frame: [0x2dbcbf] in libcuda.so.1
        =========         Host Frame:_PyEval_EvalFrameDefault [0x1a2b3c] in python3.11
        =========
        """)


# ---- reading logs ----

def test_clean_memcheck_passes():
    r = sanitize.analyse("memcheck", CLEAN_MEMCHECK, rc=0)
    assert r.ok, r.problems
    line = r.line()
    assert line.startswith("memcheck  PASS")
    assert "36 passed in 412.07s (0:06:52)" in line and "ERROR SUMMARY: 0 errors" in line
    assert "kernels: none" in line and "failed:" not in line


def test_clean_racecheck_passes():
    """The H200's line for the PYKDA_SANITIZE build over every test."""
    log = "========= COMPUTE-SANITIZER\n" + racecheck_log("", 0).replace("0 hazard ", "0 hazards ")
    r = sanitize.analyse("racecheck", log, rc=0)
    assert r.ok, r.problems
    assert r.line() == ("racecheck PASS | 36 passed in 412.07s (0:06:52) | "
                        "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings) | kernels: none")


def test_racecheck_reports_in_kda_recurrence_fail():
    """Its WAR reports were once a listed finding; now they fail like any report."""
    r = sanitize.analyse("racecheck", racecheck_log(RACE_KDA, 2), rc=0)
    assert not r.ok and r.problems == ["2 sanitizer reports"] and r.kernels == {"kda_recurrence": 2}
    line = r.line()
    assert line.startswith("racecheck FAIL")
    assert "RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)" in line
    assert "kernels: kda_recurrence (2)" in line and line.endswith("failed: 2 sanitizer reports")
    assert "known" not in line


@pytest.mark.parametrize("tool", sanitize.TOOLS)
def test_one_report_of_any_tool_fails(tool):
    if tool == "racecheck":
        log = racecheck_log(RACE_KDA.split("=========\n", 2)[0] + "=========\n", 1)
    else:
        log = memcheck_report("kda_recurrence", 0x2b30) + PASSED + "========= ERROR SUMMARY: 1 error\n"
    r = sanitize.analyse(tool, log, rc=0)
    assert not r.ok and r.problems == ["1 sanitizer report"] and r.kernels == {"kda_recurrence": 1}


def test_a_full_racecheck_hazard_table_fails_and_is_named():
    """racecheck's 'Maximum number of hazards reached' warning (counted as a warning, printed as no
    report, as on the H200) means hazards were dropped: the run cannot pass, and says what to raise."""
    full = ("========= Warning: Maximum number of hazards reached. Environment variable "
            "NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS can be used to increase this count.\n=========\n")
    table = "the hazard table filled up, reports may be missing (raise NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS)"
    log = full + PASSED + "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 1 warnings)\n"
    r = sanitize.analyse("racecheck", log, rc=0)
    assert r.problems == [table] and "kernels: none" in r.line() and r.line().startswith("racecheck FAIL")
    log = full + RACE_KDA + PASSED + "========= RACECHECK SUMMARY: 2 hazards displayed (1 errors, 1 warnings)\n"
    r = sanitize.analyse("racecheck", log, rc=0)
    assert r.problems == ["2 sanitizer reports", table] and "kernels: kda_recurrence (2)" in r.line()


@pytest.fixture
def popen_env(monkeypatch):
    """subprocess.Popen faked: each tool's run exits 0 at once; `seen["env"]` is the last run's
    environment."""
    seen = {}

    class Proc:
        def __init__(self, cmd, env=None, **kw):
            seen["env"] = env
            self.returncode = 0

        def wait(self, timeout=None):
            return 0
    monkeypatch.setattr(sanitize.subprocess, "Popen", Proc)
    return seen


def test_racecheck_runs_with_a_large_hazard_table(monkeypatch, tmp_path, popen_env):
    seen = popen_env
    monkeypatch.delenv(sanitize.RACECHECK_HAZARDS_ENV, raising=False)
    sanitize.run_tool("compute-sanitizer", "racecheck", tmp_path, cwd=tmp_path)
    assert seen["env"][sanitize.RACECHECK_HAZARDS_ENV] == str(sanitize.RACECHECK_MAX_HAZARDS)
    sanitize.run_tool("compute-sanitizer", "memcheck", tmp_path, cwd=tmp_path)
    assert sanitize.RACECHECK_HAZARDS_ENV not in seen["env"]


def test_racecheck_alone_checks_kernels_built_for_it(monkeypatch, tmp_path, popen_env):
    """PYKDA_SANITIZE=1 for racecheck (kda_recurrence's every-thread hand-back); the other tools
    check the shipped kernels, even where the caller's environment sets it."""
    seen = popen_env
    monkeypatch.setenv("PYKDA_SANITIZE", "1")
    sanitize.run_tool("compute-sanitizer", "memcheck", tmp_path, cwd=tmp_path)
    assert "PYKDA_SANITIZE" not in seen["env"]
    monkeypatch.delenv("PYKDA_SANITIZE")
    sanitize.run_tool("compute-sanitizer", "racecheck", tmp_path, cwd=tmp_path)
    assert seen["env"]["PYKDA_SANITIZE"] == "1"


def test_racecheck_reports_are_counted_by_kernel():
    other = ("========= Error: Race reported between Write access at decode_partial+0x450\n"
             "=========     and Read access at decode_partial+0x5a0 [32 hazards]\n=========\n")
    r = sanitize.analyse("racecheck", racecheck_log(RACE_KDA + other, 3), rc=0)
    assert not r.ok and r.problems == ["3 sanitizer reports"]
    line = r.line()
    assert "kernels: decode_partial (1), kda_recurrence (2)" in line and line.startswith("racecheck FAIL")


def test_reports_after_pytest_progress_marks_are_read():
    """pytest -q prints its progress marks without a newline, so a report can start mid-line."""
    other = ("....========= Error: Race reported between Write access at decode_partial+0x450\n"
             "=========     and Read access at decode_partial+0x5a0 [32 hazards]\n=========\n")
    r = sanitize.analyse("racecheck", racecheck_log(RACE_KDA.replace("========= Error", "..========= Error", 1) + other, 3), rc=0)
    # all three read (none left uncounted: "counted but not printed" would say so)
    assert r.problems == ["3 sanitizer reports"] and r.kernels == {"decode_partial": 1, "kda_recurrence": 2}


def test_racecheck_write_write_race_is_read():
    waw = ("========= Error: Race reported between Write access at kda_recurrence+0x900\n"
           "=========     and Write access at kda_recurrence+0x900 [124 hazards]\n=========\n")
    r = sanitize.analyse("racecheck", racecheck_log(waw, 1), rc=0)
    assert r.problems == ["1 sanitizer report"] and r.kernels == {"kda_recurrence": 1}


def test_racecheck_hazard_report_form():
    war = textwrap.dedent("""\
        ========= Error: Potential WAR hazard detected at __shared__ 0x400 in block (3,0,0) :
        =========     Read Thread (33,0,0) at kda_recurrence+0x1f40
        =========     Write Thread (0,0,0) at kda_recurrence+0x2b30
        =========     Current Value : 0
        =========
        """)
    for kind in ("WAR", "RAW", "WAW"):
        r = sanitize.analyse("racecheck", racecheck_log(war.replace("WAR", kind), 1), rc=0)
        assert r.problems == ["1 sanitizer report"] and r.kernels == {"kda_recurrence": 1}
        assert sanitize.parse_reports(war.replace("WAR", kind))[0].hazard == kind


def test_error_summary_of_three_errors_fails():
    log = ("========= COMPUTE-SANITIZER\n" + memcheck_report("kda_decode", 0x1a0) + memcheck_report("kda_decode", 0x1c0)
           + "========= Program hit cudaErrorInvalidValue (error 1) due to \"invalid argument\" on CUDA API call to cuMemcpyDtoH.\n"
           "=========     Saved host backtrace up to driver entry point at error\n=========\n"
           + PASSED + "========= ERROR SUMMARY: 3 errors\n")
    r = sanitize.analyse("initcheck", log, rc=0)
    assert not r.ok and r.problems == ["3 sanitizer reports"]
    line = r.line()
    assert "ERROR SUMMARY: 3 errors" in line
    assert "kernels: (no kernel: host/API) (1), kda_decode (2)" in line


def test_errors_beyond_the_print_limit_fail():
    log = memcheck_report("kda_prepare", 0x10) + PASSED + "========= ERROR SUMMARY: 40 errors\n"
    r = sanitize.analyse("memcheck", log, rc=0)
    assert "39 counted but not printed (raise --print-limit)" in r.problems
    # racecheck: more hazards counted than printed
    r = sanitize.analyse("racecheck", RACE_KDA + PASSED
                         + "========= RACECHECK SUMMARY: 2 hazards displayed (5 errors, 0 warnings)\n", rc=0)
    assert r.problems == ["2 sanitizer reports", "3 counted but not printed (raise --print-limit)"]


def test_pytest_failure_fails():
    log = ("========= COMPUTE-SANITIZER\n..F.................................\n"
           "=================================== FAILURES ===================================\n"
           "FAILED tests/test_kda_gpu.py::test_state_layouts_agree - AssertionError: assert False\n"
           "1 failed, 35 passed in 398.20s (0:06:38)\n"
           "========= Target application returned an error\n========= ERROR SUMMARY: 0 errors\n")
    r = sanitize.analyse("synccheck", log, rc=1)
    assert not r.ok
    assert r.pytest_line == "1 failed, 35 passed in 398.20s (0:06:38)"
    assert r.problems[0] == "exit status 1"
    assert "FAILED tests/test_kda_gpu.py::test_state_layouts_agree" in r.problems[1]
    assert "kernels: none" in r.line() and "ERROR SUMMARY: 0 errors" in r.line()
    # pytest without -q: its bars, even nine '=' wide, are not sanitizer reports
    bars = log.replace("1 failed, 35 passed in 398.20s (0:06:38)", "========= 1 failed, 35 passed in 398.20s =========")
    r = sanitize.analyse("synccheck", bars, rc=1)
    assert r.pytest_line == "1 failed, 35 passed in 398.20s" and not r.kernels


def test_skipped_tests_or_a_dead_process_fail():
    skipped = "36 skipped in 2.10s\n========= ERROR SUMMARY: 0 errors\n"
    r = sanitize.analyse("memcheck", skipped, rc=0)
    assert any("36 skipped" in p for p in r.problems) and "no test passed" in r.problems
    died = "========= COMPUTE-SANITIZER\n........\n========= Error: process didn't terminate successfully\n"
    r = sanitize.analyse("memcheck", died, rc=139)
    assert r.problems[:2] == ["exit status 139", "pytest printed no result line (the process died? see the log)"]
    assert "no ERROR SUMMARY line" in r.problems[-1]
    r = sanitize.analyse("racecheck", "....", rc=None, timeout_s=60)
    assert r.problems[0] == "timed out after 60 s (killed)" and "no RACECHECK SUMMARY line" in r.problems[-1]


@pytest.mark.parametrize("location, kernel", [
    ("kda_recurrence+0x2b30", "kda_recurrence"),
    ("kda_recurrence+0x2b30 in /root/.cache/pykda/kda_recurrence.cu:251", "kda_recurrence"),
    ("void block_reverse_kernel<(bool)0>(float *)+0x150 in cuda.cu:27", "block_reverse_kernel"),
    ("race_condition(float *)+0xb0 in 18_debug_demo.cu:28", "race_condition"),
    ("0x00000170 in ./race.cu:4:test(int*, int*)", "test"),
    ("0x68 in sgemm_32x32x32_NT_vec", "sgemm_32x32x32_NT_vec"),
    ("void at::native::(anonymous namespace)::fill_kernel<float>(int, float)+0x40",
     "at::native::{anonymous}::fill_kernel"),
])
def test_kernel_names_from_report_locations(location, kernel):
    assert sanitize.kernel_of(location) == kernel


# ---- command lines, the tool, the CLI ----

@pytest.mark.parametrize("tool", sanitize.TOOLS)
def test_command_line_of_each_tool(tool):
    cmd = sanitize.build_command("/opt/cuda/bin/compute-sanitizer", tool, print_limit=500, pytest_args=["-x"],
                                 python="/usr/bin/python3")
    assert cmd == ["/opt/cuda/bin/compute-sanitizer", "--tool", tool, "--print-limit", "500", "/usr/bin/python3", "-m",
                   "pytest", "-q", "-p", "no:cacheprovider", "-x", *sanitize.TESTS]


def test_tool_list_parsing():
    assert sanitize.parse_tools("racecheck, memcheck,racecheck") == ("racecheck", "memcheck")
    with pytest.raises(ValueError, match="unknown sanitizer tool 'leakcheck'"):
        sanitize.parse_tools("memcheck,leakcheck")


def fake_tool(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    exe = path / "compute-sanitizer"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_sanitizer_found_on_path_then_cuda_home_then_fallback(tmp_path):
    on_path, home, usr = fake_tool(tmp_path / "p"), fake_tool(tmp_path / "home" / "bin"), fake_tool(tmp_path / "usr")
    env = {"PATH": str(on_path.parent), "CUDA_HOME": str(tmp_path / "home")}
    assert sanitize.find_sanitizer(env, fallback_dirs=(str(usr.parent),)) == str(on_path)
    env["PATH"] = str(tmp_path / "nothing")
    assert sanitize.find_sanitizer(env, fallback_dirs=(str(usr.parent),)) == str(home)
    assert sanitize.find_sanitizer({"PATH": ""}, fallback_dirs=(str(usr.parent),)) == str(usr)


def test_missing_sanitizer_is_a_clear_error(tmp_path, monkeypatch, capsys):
    with pytest.raises(sanitize.SanitizerNotFound) as e:
        sanitize.find_sanitizer({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "cuda")},
                                fallback_dirs=(str(tmp_path / "none"),))
    msg = str(e.value)
    assert "compute-sanitizer not found on PATH" in msg and f"{tmp_path}/cuda/bin" in msg
    assert str(tmp_path / "none") in msg and "CUDA toolkit" in msg
    # through the command line: one line on stderr, exit status 2, nothing run
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(sanitize, "FALLBACK_DIRS", (str(tmp_path / "none"),))
    assert cli_main(["sanitize", "--log-dir", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: compute-sanitizer not found") and not (tmp_path / "logs").exists()


def test_unknown_tool_on_the_command_line(capsys):
    assert cli_main(["sanitize", "--tool", "memcheck,leakcheck"]) == 2
    assert "unknown sanitizer tool 'leakcheck'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-2", "four"])
def test_shards_must_be_a_count_of_at_least_one(bad, capsys):
    """--shards is argparse's usage error naming the value before anything runs."""
    with pytest.raises(SystemExit) as exc:
        cli_main(["sanitize", "--shards", bad])
    assert exc.value.code == 2 and f"argument --shards: {bad!r} is not a count of at least 1" in capsys.readouterr().err


FAKE_SANITIZER = """#!{python}
import os
import sys
tool = sys.argv[sys.argv.index("--tool") + 1]
ids = [a for a in sys.argv if "::" in a]
print("========= COMPUTE-SANITIZER")
print("." * len(ids))
sanitize_build = os.environ.get("PYKDA_SANITIZE") == "1"
if tool == "racecheck" and not sanitize_build:   # the shipped kda_recurrence's hand-back
    print("========= Error: Race reported between Write access at kda_recurrence+0x2b30")
    print("=========     and Read access at kda_recurrence+0x1f40 [6944 hazards]")
    print("=========")
if tool == "initcheck":
    print("========= Uninitialized __global__ memory read of size 4 bytes")
    print("=========     at kda_decode+0x1a0")
    print("=========     by thread (0,0,0) in block (0,0,0)")
    print("=========")
print(f"{{len(ids)}} passed in 1.00s")
if tool == "racecheck" and sanitize_build:
    print("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
elif tool == "racecheck":
    print("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
else:
    print(f"========= ERROR SUMMARY: {{1 if tool == 'initcheck' else 0}} error{{'' if tool == 'initcheck' else 's'}}")
"""


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch) -> Path:
    """FAKE_SANITIZER as `compute-sanitizer`, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "compute-sanitizer"
    exe.write_text(FAKE_SANITIZER.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


def test_a_whole_run_against_a_fake_sanitizer(tmp_path, fake_sanitizer, capsys):
    exe = fake_sanitizer
    logs = tmp_path / "logs"
    assert cli_main(["sanitize", "--tool", "memcheck,racecheck", "--log-dir", str(logs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{len(sanitize.TESTS)} tests under {exe} (memcheck, racecheck); logs in {logs}"
    assert out[1].startswith(f"memcheck  PASS | {len(sanitize.TESTS)} passed in 1.00s | ERROR SUMMARY: 0 errors")
    # racecheck ran the PYKDA_SANITIZE build: the fake reports kda_recurrence otherwise
    assert out[2] == (f"racecheck PASS | {len(sanitize.TESTS)} passed in 1.00s | "
                      "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings) | kernels: none")
    assert out[3] == f"sanitize: clean (memcheck, racecheck); logs in {logs}"
    log = (logs / "racecheck.log").read_text()
    assert log.startswith(f"$ {exe} --tool racecheck --print-limit 10000 ") and "kda_recurrence+0x2b30" not in log
    assert cli_main(["sanitize", "--tool", "initcheck", "--log-dir", str(logs), "--print-limit", "7"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("initcheck FAIL") and "kernels: kda_decode (1)" in out[1]
    assert out[-1] == f"sanitize: FAILED (initcheck); logs in {logs}"
    assert "--print-limit 7 " in (logs / "initcheck.log").read_text().splitlines()[0]


def test_a_run_in_shards_against_a_fake_sanitizer(tmp_path, monkeypatch, fake_sanitizer, capsys):
    """--shards 3: each tool in three processes at once over thirds of the selected tests, a log
    each, one merged line: pytest's counts added, the common summary once; a report in one shard
    fails the tool and is named by its shard."""
    exe = fake_sanitizer
    selected = sanitize.TESTS[:7]
    asked = []
    monkeypatch.setattr(sanitize, "selected_tests", lambda tests, args, cwd: asked.append(args) or selected)
    logs = tmp_path / "logs"
    assert cli_main(["sanitize", "--tool", "memcheck,initcheck", "--shards", "3", "--log-dir", str(logs),
                     "--pytest-args=-k decode"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert asked == [["-k", "decode"]]
    assert out[0] == f"7 tests under {exe} (memcheck, initcheck, 3 processes at once); logs in {logs}"
    assert out[1] == "memcheck  PASS | 7 passed in 3 shards | ERROR SUMMARY: 0 errors | kernels: none"
    assert out[2].startswith("initcheck FAIL | 7 passed in 3 shards | ERROR SUMMARY: 1 error | kernels: kda_decode (3)")
    assert out[2].endswith("failed: shard 1: 1 sanitizer report; shard 2: 1 sanitizer report; "
                           "shard 3: 1 sanitizer report")
    for k, share in enumerate((selected[0::3], selected[1::3], selected[2::3]), 1):
        command = shlex.split((logs / f"memcheck.{k}.log").read_text().splitlines()[0][2:])
        assert [a for a in command if "::" in a] == list(share) and command[-len(share) - 2:-len(share)] == ["-k", "decode"]
    assert not (logs / "memcheck.log").exists()


def test_a_shard_past_the_timeout_is_killed_and_fails_the_tool(tmp_path):
    """The shards share the tool's deadline: one that hangs (and its child) is killed there, the
    others' verdicts stand, and the tool fails naming the killed shard."""
    exe = tmp_path / "compute-sanitizer"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import subprocess, sys, time
        ids = [a for a in sys.argv if "::" in a]
        if "tests/x.py::hang" in ids:
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            time.sleep(60)
        print(f"{{len(ids)}} passed in 0.01s")
        print("========= ERROR SUMMARY: 0 errors")
        """))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    start = time.monotonic()
    r = sanitize.run_tool(str(exe), "memcheck", tmp_path, ("tests/x.py::a", "tests/x.py::hang", "tests/x.py::b"),
                          timeout_s=3, cwd=tmp_path, shards=2)
    assert time.monotonic() - start < 30
    assert r.pytest_counts == {"passed": 2} and r.rc is None
    assert r.problems[0] == "shard 2: timed out after 3 s (killed)"
    assert [p.name for p in r.log_path] == ["memcheck.1.log", "memcheck.2.log"]


def test_shards_that_disagree_name_theirs():
    """A summary only some shards printed carries their numbers; a killed shard fails the tool."""
    clean = sanitize.analyse("memcheck", "3 passed in 1.00s\n========= ERROR SUMMARY: 0 errors\n", rc=0)
    dead = sanitize.analyse("memcheck", "", rc=None, timeout_s=60)
    r = sanitize.merge_shards("memcheck", [clean, clean, dead])
    assert r.rc is None and r.pytest_line is None and r.pytest_counts == {"passed": 6}
    assert r.summaries == ["ERROR SUMMARY: 0 errors (shards 1, 2)"]
    assert not r.ok and r.problems[0] == "shard 3: timed out after 60 s (killed)"


def test_the_tests_a_selection_keeps_are_collected_without_a_sanitizer(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_keep():\n    pass\n\n\ndef test_drop():\n    pass\n")
    ids = ("test_x.py::test_keep", "test_x.py::test_drop")
    assert sanitize.selected_tests(ids, ["-k", "keep"], tmp_path) == ("test_x.py::test_keep",)
    with pytest.raises(sanitize.SanitizeError, match="pytest selected no test of the list with -k nothing"):
        sanitize.selected_tests(ids, ["-k", "nothing"], tmp_path)


# ---- the test ids ----

def test_ids_cover_every_gpu_file_once():
    assert len(set(sanitize.TESTS)) == len(sanitize.TESTS)
    files = {t.split("::")[0] for t in sanitize.TESTS}
    assert files == {"tests/test_decode_gpu.py", "tests/test_batch_decode_gpu.py", "tests/test_paged_decode_gpu.py",
                     "tests/test_kda_gpu.py",
                     "tests/test_kda_segments_gpu.py", "tests/test_kda_cp_gpu.py",
                     "tests/test_kda_decode_gpu.py", "tests/test_graphs_gpu.py"}
    assert all((ROOT / f).is_file() for f in files)


def test_the_ids_are_collected_by_pytest():
    """Every id names one collected test (a renamed test or changed parameters fail here)."""
    missing = [m for m in ("torch", "cupy") if importlib.util.find_spec(m) is None]
    if missing:   # the GPU test modules importorskip them: nothing would be collected
        pytest.skip(f"collecting the GPU tests needs {' and '.join(missing)}")
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *sanitize.TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named 'torch'" in r.stdout + r.stderr:
        pytest.skip("torch cannot be imported here")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    collected = [line.strip() for line in r.stdout.splitlines() if "::" in line]
    assert sorted(collected) == sorted(sanitize.TESTS)
