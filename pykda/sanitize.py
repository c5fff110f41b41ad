"""`python -m pykda sanitize`: a GPU test subset of every op under NVIDIA compute-sanitizer (issue 14).

Each tool runs in its own process, one after another (with `--shards N`, in N processes at once,
each a share of the tests pytest selects, their verdicts merged):

    compute-sanitizer --tool TOOL --print-limit N python -m pytest -q -p no:cacheprovider [PYTEST_ARGS] TESTS...

from the repository root (the tests are the checkout's), its stdout and stderr together written to
LOG_DIR/TOOL.log. A summary line per tool gives pytest's result line, the sanitizer's ERROR SUMMARY
(RACECHECK SUMMARY for racecheck) and the kernels its reports name. A tool fails when a test fails
or is skipped (a sanitized run that skipped a test checked nothing there), when the process dies or
times out, when its summary is missing, when it prints any report (every report of every tool is a
failure), and when the summary counts more errors than it printed (raise --print-limit).

racecheck runs kernels built for it (PYKDA_SANITIZE, see pykda.runtime.render): there
kda_recurrence and decode_partial hand each ring stage back with every consumer thread's arrive
instead of lane 0's after __syncwarp. The shipped hand-back is correct (the producer's wait
acquires lane 0's release, ordered after the warp's reads by the warp barrier), but racecheck
credits an arrive to the arriving thread alone and would report the reads of lanes 1..31 as races
against the producer's refill (examples/racecheck_mbarrier_pipeline.py reproduces it). The other
tools check the shipped build. On the H200 all four tools report nothing over every test
(racecheck: 0 hazards displayed).

Allocations come from torch's caching allocator and CuPy's pool, as in serving: memcheck sees an
access outside the allocator's segments, not one into a neighbouring tensor of the same segment; the
tests' NaN-poisoned outputs and padding rows check that side.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .runtime.render import SANITIZE_ENV

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
DEFAULT_PRINT_LIMIT = 10000
DEFAULT_TIMEOUT_S = 3600
# racecheck keeps this many hazards, then warns and drops the rest (analyse then fails the run:
# reports may be missing). The default is too small for one race in a loop: kda_recurrence's
# one-arrive-per-warp hand-back, checked without PYKDA_SANITIZE, counts ~370 000 hazards per
# instruction pair in the segment tests. This table keeps every report of such a regression.
RACECHECK_HAZARDS_ENV = "NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS"
RACECHECK_MAX_HAZARDS = 1 << 26
_HAZARDS_FULL = "Warning: Maximum number of hazards reached"   # the sanitizer's words
ROOT = Path(__file__).resolve().parent.parent
FALLBACK_DIRS = ("/usr/local/cuda/bin",)

# The tests every tool runs: small, fast cases of every op (a sanitizer slows kernels 10-100x).
# Exact pytest node ids (pytest builds a parametrized id from the bottom decorator first);
# tests/test_sanitize.py collects them, so a renamed test or a changed parameter fails there.
TESTS = (
    # flash decoding, one sequence (decode_partial, then decode_merge of the split chunks)
    "tests/test_decode_gpu.py::test_matches_reference[65-32-8-128-bfloat16]",        # GQA 4:1, a partial last tile
    "tests/test_decode_gpu.py::test_hnd_layout_matches_reference[1000-8-1-64-float16]",   # HND, fp16, D 64, MQA
    "tests/test_decode_gpu.py::test_planner_overrides_give_the_same_answer[64-2]",   # 79 chunks of 64 rows: split + merge
    "tests/test_decode_gpu.py::test_strided_views_of_a_larger_cache",
    "tests/test_decode_gpu.py::test_frameworks_agree",                                 # CuPy arrays, CuPy's pool
    # flash decoding, a padded batch (kv_lens on the device, NaN past each length)
    "tests/test_batch_decode_gpu.py::test_matches_reference[17-3-NHD-32-8-256-bfloat16]",   # lengths 17, 0, 1; D 256
    "tests/test_batch_decode_gpu.py::test_short_calls_run_decode_tiny_and_match_the_reference[3-20-64-8-128-float16-NHD]",  # decode_tiny, 2 heads a thread
    "tests/test_batch_decode_gpu.py::test_short_calls_run_decode_tiny_and_match_the_reference[2-33-8-2-256-float16-NHD]",  # decode_tiny, 64 rows
    "tests/test_batch_decode_gpu.py::test_matches_reference[1000-3-HND-64-4-64-float16]",   # a group of 16 (not transposed)
    "tests/test_batch_decode_gpu.py::test_split_sequences_of_different_lengths_and_scale[64-4]",   # merge: 4 warps a row
    "tests/test_batch_decode_gpu.py::test_split_sequences_of_different_lengths_and_scale[512-1]",  # a warp a row
    "tests/test_batch_decode_gpu.py::test_split_sequences_merge_in_clusters[384-4]",   # clusters of 4, 3 chunks: DSMEM
    "tests/test_batch_decode_gpu.py::test_strided_hnd_views_of_a_larger_cache",
    "tests/test_batch_decode_gpu.py::test_one_tile_ctas_gather_their_rows_or_read_boxes[128-HND-True]",   # warps' gather
    "tests/test_batch_decode_gpu.py::test_one_tile_ctas_gather_their_rows_or_read_boxes[128-NHD-False]",  # one-tile TMA
    "tests/test_batch_decode_gpu.py::test_balanced_split_matches_reference[300-200-16-16-128-float16-NHD]",   # balanced: many units a CTA
    "tests/test_batch_decode_gpu.py::test_balanced_split_matches_reference[7-4097-64-2-128-bfloat16-NHD]",    # balanced: two head blocks
    # flash decoding, a paged cache: cp.async gather (page 1) and TMA boxes (16, 128), bad page ids
    "tests/test_paged_decode_gpu.py::test_split_requests_merge_with_scale[1-64]",
    "tests/test_paged_decode_gpu.py::test_split_requests_merge_with_scale[16-64]",
    "tests/test_paged_decode_gpu.py::test_pages_of_16_in_box_major_tiles[256-HND]",   # a page's 4 sub-tiles, one copy
    "tests/test_paged_decode_gpu.py::test_split_requests_merge_with_scale[128-192]",   # chunks of 3 tiles, mid-page
    "tests/test_paged_decode_gpu.py::test_split_requests_merge_in_clusters[1-128-8]",   # gathered pages, clusters of 8
    "tests/test_paged_decode_gpu.py::test_page_ids_outside_the_pool_read_zeros[1]",   # (and [16]: decode_tiny's)
    "tests/test_paged_decode_gpu.py::test_short_requests_take_decode_tiny[16-NHD-64-8-128-bfloat16]",   # decode_tiny paged
    "tests/test_paged_decode_gpu.py::test_cuda_graph_replays_new_page_tables[16-first3]",   # decode_tiny over longer rows
    "tests/test_paged_decode_gpu.py::test_page_ids_outside_the_pool_read_zeros[128]",
    "tests/test_paged_decode_gpu.py::test_one_tile_ctas_gather_pages_of_every_size[16-HND-256]",   # warps' gather
    "tests/test_paged_decode_gpu.py::test_a_one_tile_graph_replays_longer_requests",   # its one stage over many tiles
    "tests/test_paged_decode_gpu.py::test_few_long_requests_take_the_balanced_split[1]",    # balanced, gathered pages
    "tests/test_paged_decode_gpu.py::test_few_long_requests_take_the_balanced_split[16]",   # balanced, a TMA box a page
    # KDA prefill (kda_prepare, kda_recurrence): every gate mode, state pool, both layouts
    "tests/test_kda_gpu.py::test_small_against_reference_no_state",                  # the racecheck case
    "tests/test_kda_gpu.py::test_matches_reference[128-16-batch-bfloat16]",           # B 3, no cu_seqlens
    "tests/test_kda_gpu.py::test_variants_match_reference[float32-64-16-softplus-bfloat16-logit-bfloat16-True]",
    "tests/test_kda_gpu.py::test_variants_match_reference[float32-64-16-safe-bfloat16-logit-bfloat16-True]",
    "tests/test_kda_gpu.py::test_variants_match_reference[float32-64-16-none-float32-prob-float32-True]",
    "tests/test_kda_gpu.py::test_variants_match_reference[bfloat16-128-32-softplus-bfloat16-logit2-bfloat16-False]",
    "tests/test_kda_gpu.py::test_prefill_on_the_state_pool[index_dtype0-float32]",    # int32 rows, padding, pool
    "tests/test_kda_gpu.py::test_prefill_on_the_state_pool[index_dtype1-bfloat16]",   # int64 rows, bf16 pool
    "tests/test_kda_gpu.py::test_state_layouts_agree",                                # [N, H, K, V] and [N, H, V, K]
    "tests/test_kda_gpu.py::test_rows_outside_the_sequences_stay_poisoned",
    # KDA prefill in segments (pass 1 maps, kda_segment_scan, pass 2): segments of 3 chunks and of 1,
    # a partial last one; varlen on the pool, read and written in place
    "tests/test_kda_segments_gpu.py::test_segments_match_reference[64-16-batch-float32-3]",
    "tests/test_kda_segments_gpu.py::test_segments_match_reference[128-32-batch-bfloat16-1]",
    "tests/test_kda_segments_gpu.py::test_segments_on_the_state_pool_in_place[float32]",
    "tests/test_kda_segments_gpu.py::test_warpgroup_products_match_reference[varlen-3-False]",   # wgmma, K-first
    "tests/test_kda_segments_gpu.py::test_warpgroup_products_match_reference[batch-0-True]",    # 8-warp chain on wgmma
    "tests/test_kda_segments_gpu.py::test_bf16_checkpoints_of_fp32_states_are_the_fp32_ones_rounded[True-3]",   # varlen
    "tests/test_kda_segments_gpu.py::test_two_level_scan_matches_reference[2-64-32]",   # the scan's three walks
    # a rank's slice (context parallelism): pass 1 of every segment, both rank scans, pass 2
    "tests/test_kda_cp_gpu.py::test_slices_join_into_the_whole_sequence[softplus-128-16-3]",
    "tests/test_kda_cp_gpu.py::test_slices_join_into_the_whole_sequence[safe-64-16-None]",
    # KDA decode (kda_decode): every gate mode, pool rows with padding, packed sequences, a wrapping ring
    "tests/test_kda_decode_gpu.py::test_decode_continues_a_prefill[safe-v_first]",
    "tests/test_kda_decode_gpu.py::test_decode_continues_a_prefill[softplus-v_first]",
    "tests/test_kda_decode_gpu.py::test_decode_continues_a_prefill[none-v_first]",
    "tests/test_kda_decode_gpu.py::test_gate_modes_match_reference[bfloat16-none-v_first]",
    "tests/test_kda_decode_gpu.py::test_matches_reference_with_random_and_padded_indices[3-2-64-bfloat16-v_first]",
    "tests/test_kda_decode_gpu.py::test_matches_reference_with_random_and_padded_indices[64-1-128-float32-v_first]",
    "tests/test_kda_decode_gpu.py::test_packed_sequences_with_empty_and_padded_ones[v_first]",
    "tests/test_kda_decode_gpu.py::test_check_indices_catches_duplicates_and_out_of_range",
    "tests/test_kda_decode_gpu.py::test_every_tile_shape_and_ring_depth_agrees[1-2-float32]",
    "tests/test_kda_decode_gpu.py::test_speculative_step_matches_reference[64-bfloat16-softplus-v_first]",   # 2-D rows
    "tests/test_kda_decode_gpu.py::test_speculative_packed_as_vllm_calls_it[float32-v_first]",
    "tests/test_kda_decode_gpu.py::test_target_verify_equals_the_speculative_step[float32-v_first-True]",   # SGLang's
    "tests/test_kda_decode_gpu.py::test_tree_verify_starts_each_token_from_its_parent[float32-v_first-int64]",
    "tests/test_kda_decode_gpu.py::test_tree_verify_starts_each_token_from_its_parent[bfloat16-k_first-int32]",
    # KDA decode on tensor cores (kda_decode_mma): cp.async state rows, bf16 V-first pools
    "tests/test_kda_decode_gpu.py::test_tensor_core_step_matches_reference_and_the_recurrent_kernel[4-softplus-128]",
    "tests/test_kda_decode_gpu.py::test_tensor_core_step_matches_reference_and_the_recurrent_kernel[8-none-64]",
    # K-first pools (whole-state tiles, column sums through shared memory): padding, empty sequences,
    # tokens read from global memory past the staged ones
    "tests/test_kda_decode_gpu.py::test_packed_sequences_with_empty_and_padded_ones[k_first]",
    # CUDA graphs of every op (torch's idiom; graphs sharing a pool; a capture on a fresh stream)
    "tests/test_graphs_gpu.py::test_single_decode_torch_idiom",
    "tests/test_graphs_gpu.py::test_single_decode_shared_pool_and_fresh_stream",
    "tests/test_graphs_gpu.py::test_batch_decode_torch_idiom",
    "tests/test_graphs_gpu.py::test_batch_decode_shared_pool_and_fresh_stream",
    "tests/test_graphs_gpu.py::test_fused_recurrent_kda_torch_idiom",
    "tests/test_graphs_gpu.py::test_fused_recurrent_kda_shared_pool_and_fresh_stream",
    "tests/test_graphs_gpu.py::test_chunk_kda_torch_idiom",
    "tests/test_graphs_gpu.py::test_chunk_kda_shared_pool_and_fresh_stream",
)


class SanitizeError(RuntimeError):
    """The sanitize command cannot run (said in one sentence)."""


class SanitizerNotFound(SanitizeError, FileNotFoundError):
    pass


# ---- finding the tool, building its command line ----

def find_sanitizer(env=None, fallback_dirs=None) -> str:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin, else in /usr/local/cuda/bin (FALLBACK_DIRS)."""
    env = os.environ if env is None else env
    fallback_dirs = FALLBACK_DIRS if fallback_dirs is None else fallback_dirs
    found = shutil.which("compute-sanitizer", path=env.get("PATH", ""))
    if found:
        return found
    dirs = ([str(Path(env["CUDA_HOME"]) / "bin")] if env.get("CUDA_HOME") else []) + list(fallback_dirs)
    for d in dirs:
        exe = Path(d) / "compute-sanitizer"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    cuda_home = f"$CUDA_HOME/bin ({env['CUDA_HOME']}/bin)" if env.get("CUDA_HOME") else "$CUDA_HOME/bin (CUDA_HOME unset)"
    raise SanitizerNotFound(
        f"compute-sanitizer not found on PATH, in {cuda_home} or in {', '.join(fallback_dirs)}: it ships with the "
        "CUDA toolkit (not with the pip wheels pykda uses); install the toolkit, or put compute-sanitizer on PATH "
        "or set CUDA_HOME")


def parse_tools(text: str) -> tuple[str, ...]:
    """"memcheck,racecheck" -> ("memcheck", "racecheck"); an unknown name raises ValueError."""
    tools = []
    for name in (t.strip() for t in text.split(",")):
        if not name:
            continue
        if name not in TOOLS:
            raise ValueError(f"unknown sanitizer tool {name!r}: choose from {', '.join(TOOLS)}")
        if name not in tools:
            tools.append(name)
    if not tools:
        raise ValueError(f"no sanitizer tool given: choose from {', '.join(TOOLS)}")
    return tuple(tools)


def build_command(sanitizer: str, tool: str, tests=TESTS, print_limit: int = DEFAULT_PRINT_LIMIT,
                  pytest_args=(), python: str = sys.executable) -> list[str]:
    return [sanitizer, "--tool", tool, "--print-limit", str(print_limit),
            python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, *tests]


# ---- reading a log ----

PREFIX = "========="
_META = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
         "Error: process didn't terminate successfully", "Target application returned an error",
         "Error: couldn't find exit code", "Error: Target application terminated before first instrumented API call",
         "Tracking kernels launched by child processes",
         _HAZARDS_FULL)   # a notice (analyse fails the run on it), not a report
_ACCESS = re.compile(r"\b(?:between|and) (Read|Write) access at (.+?)"
                     r"(?=\s+and (?:Read|Write) access at |\s*\[\d+ hazards?\]|$)")
_AND_ACCESS = re.compile(r"and (?:Read|Write) access at ")
_HAZARD = re.compile(r"Potential (RAW|WAR|WAW) hazard")
_AT = re.compile(r"^(?:(?:Read|Write) Thread \([^)]*\) )?at (.+)$")
_PROGRESS = re.compile(r"^[.sFEx]+(?=" + PREFIX + ")")   # pytest -q's progress marks, no newline before the sanitizer's
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_PYTEST_LINE = re.compile(r"^=*\s*((?:\d+ (?:failed|passed|skipped|deselected|xfailed|xpassed|warnings?|errors?|rerun)"
                          r"(?:, )?)+ in [0-9.]+s(?: \([0-9:]+\))?|no tests ran in [0-9.]+s(?: \([0-9:]+\))?)\s*=*\s*$")


def kernel_of(location: str) -> str:
    """The kernel (or device function) a report's location names, without template arguments,
    parameters, offset or source line: "void f<(bool)0>(int *)+0x150 in a.cu:27" -> "f";
    "kda_recurrence+0x2b30" -> "kda_recurrence"; the old "0x170 in ./a.cu:4:test(int*, int*)" -> "test"."""
    loc = location.strip()
    old = re.match(r"0x[0-9a-fA-F]+ in (.+)$", loc)
    if old:
        loc = old.group(1)
        with_line = re.match(r"\S+:\d+:(.+)$", loc)
        if with_line:
            loc = with_line.group(1)
    else:
        loc = re.split(r"\+0x[0-9a-fA-F]+", loc, maxsplit=1)[0]
        loc = re.sub(r"\s+in \S+:\d+$", "", loc)
    loc = loc.replace("(anonymous namespace)", "{anonymous}").strip()
    cut = min([i for i in (loc.find("<"), loc.find("(")) if i > 0], default=len(loc))
    words = loc[:cut].split()
    return words[-1] if words else loc


@dataclass
class Report:
    """One sanitizer report: its first line and its indented lines joined by spaces."""
    header: str
    lines: list = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join([self.header, *self.lines])

    @property
    def accesses(self) -> list:
        """racecheck's analysis report: [(Read|Write, kernel)], the "between" access first."""
        if "Race reported between" not in self.text:
            return []
        return [(kind, kernel_of(loc)) for kind, loc in _ACCESS.findall(self.text)]

    @property
    def hazard(self):
        """racecheck's hazard report: RAW, WAR or WAW."""
        m = _HAZARD.search(self.header)
        return m.group(1) if m else None

    @property
    def kernels(self) -> tuple:
        acc = self.accesses
        if acc:
            names = [k for _, k in acc]
        else:
            names = []
            for line in self.lines:
                m = _AT.match(line)
                if m:
                    names.append(kernel_of(m.group(1)))
            names = names[:1] if not self.hazard else names   # memcheck & co: where it happened
        return tuple(dict.fromkeys(names)) or ("(no kernel: host/API)",)


def parse_reports(log: str) -> list:
    """The sanitizer's reports in a log (pytest's own lines, which have no prefix, are skipped)."""
    reports, current = [], None
    for raw in log.splitlines():
        raw = _PROGRESS.sub("", raw.rstrip())
        # the sanitizer's lines: "=========" alone, or "========= " and text; pytest's bars
        # ("===== FAILURES =====", "========= 1 failed in 2s =========") are not
        if raw != PREFIX and not (raw.startswith(PREFIX + " ") and not raw.endswith("=")):
            continue
        body = raw[len(PREFIX):]
        if not body.strip():
            current = None                       # a bare "=========" ends a report
        elif (body[:1] == " " and body[1:2].isspace()) or _AND_ACCESS.match(body.strip()):
            if current is not None:
                current.lines.append(body.strip())
        else:
            body = body.strip()
            if body.startswith(_META):
                current = None
            else:
                current = Report(body)
                reports.append(current)
    return reports


def parse_pytest(log: str):
    """pytest's final result line ("1 failed, 34 passed in 12.3s") and its counts, or (None, {})."""
    line = None
    for raw in log.splitlines():
        m = _PYTEST_LINE.match(raw.strip())
        if m:
            line = m.group(1)
    if line is None:
        return None, {}
    counts = Counter()
    for n, word in re.findall(r"(\d+) (\w+)", line.split(" in ")[0]):
        counts[{"error": "errors", "warning": "warnings"}.get(word, word)] += int(n)
    return line, dict(counts)


@dataclass
class ToolResult:
    tool: str
    log_path: object = None                # a Path, or a list of them for a tool run in shards
    rc: object = None                      # None: killed at the timeout
    pytest_line: object = None
    pytest_counts: dict = field(default_factory=dict)
    summaries: list = field(default_factory=list)
    kernels: Counter = field(default_factory=Counter)     # reports, by the kernels they name
    problems: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        parts = [f"{self.tool:<9} {'PASS' if self.ok else 'FAIL'}",
                 self.pytest_line or "(no pytest result line)",
                 "; ".join(self.summaries) or "(no sanitizer summary)",
                 "kernels: " + (", ".join(f"{k} ({n})" for k, n in sorted(self.kernels.items())) or "none")]
        if self.problems:
            parts.append("failed: " + "; ".join(self.problems))
        return " | ".join(parts)


def analyse(tool: str, log: str, rc, timeout_s=None, log_path=None, seconds=0.0) -> ToolResult:
    """A tool's verdict from its log and exit status."""
    r = ToolResult(tool, log_path=log_path, rc=rc, seconds=seconds)
    r.pytest_line, r.pytest_counts = parse_pytest(log)
    c = r.pytest_counts
    if rc is None:
        r.problems.append(f"timed out after {timeout_s} s (killed)")
    elif rc != 0:
        r.problems.append(f"exit status {rc}")
    if r.pytest_line is None:
        r.problems.append("pytest printed no result line (the process died? see the log)")
    else:
        failed = [ln.strip() for ln in log.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
        if c.get("failed") or c.get("errors"):
            r.problems.append(f"{c.get('failed', 0)} failed, {c.get('errors', 0)} errors"
                              + (f" ({'; '.join(failed[:3])}{' ...' if len(failed) > 3 else ''})" if failed else ""))
        if c.get("skipped"):
            r.problems.append(f"{c['skipped']} skipped (a sanitized run must run every test: is a GPU visible?)")
        if not c.get("passed"):
            r.problems.append("no test passed")

    reports = parse_reports(log)
    for rep in reports:
        for name in rep.kernels:
            r.kernels[name] += 1
    if reports:
        r.problems.append(f"{len(reports)} sanitizer report{'s' if len(reports) > 1 else ''}")

    errors = [int(n) for n in _ERROR_SUMMARY.findall(log)]
    races = [tuple(map(int, m)) for m in _RACE_SUMMARY.findall(log)]
    if errors:
        r.summaries.append(f"ERROR SUMMARY: {errors[-1]} error{'s' if errors[-1] != 1 else ''}")
    if races:
        h, e, w = races[-1]
        r.summaries.append(f"RACECHECK SUMMARY: {h} hazard{'s' if h != 1 else ''} displayed ({e} errors, {w} warnings)")
    counted = (races[-1][1] + races[-1][2]) if (tool == "racecheck" and races) else (errors[-1] if errors else None)
    if tool == "racecheck" and _HAZARDS_FULL in log:   # counted among the warnings, printed as no report
        r.problems.append(f"the hazard table filled up, reports may be missing (raise {RACECHECK_HAZARDS_ENV})")
        counted = counted - 1 if counted else counted
    if counted is None:
        r.problems.append(f"no {'RACECHECK' if tool == 'racecheck' else 'ERROR'} SUMMARY line (the sanitizer did not finish)")
    elif counted > len(reports):
        r.problems.append(f"{counted - len(reports)} counted but not printed (raise --print-limit)")
    return r


# ---- running ----

def source_root() -> Path:
    if not (ROOT / "tests" / "conftest.py").is_file():
        raise SanitizeError(f"python -m pykda sanitize runs the repository's GPU tests: run it from a source checkout "
                            f"(no tests/ beside the pykda package in {ROOT})")
    return ROOT


def tool_env(tool: str) -> dict:
    """The environment of a tool's runs: racecheck's large hazard table and its kernels built for
    it; the other tools check the kernels as they ship."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tool == "racecheck":
        env.setdefault(RACECHECK_HAZARDS_ENV, str(RACECHECK_MAX_HAZARDS))
        env[SANITIZE_ENV] = "1"   # kernels built for it: kda_recurrence's every-thread hand-back
    else:
        env.pop(SANITIZE_ENV, None)
    return env


def _start(cmd: list, log_path: Path, env: dict, cwd):
    """The process of `cmd`, its stdout and stderr written to log_path (after the command line)."""
    log = open(log_path, "w", encoding="utf-8")
    log.write(f"$ {shlex.join(cmd)}\n\n")
    log.flush()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd or source_root(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)   # its own process group: a timeout ends all of it
    except BaseException:
        log.close()
        raise
    return proc, log


def _wait_all(procs: list, deadline: float) -> list:
    """Exit statuses of `procs` ((process, log) pairs), None for one killed at `deadline`
    (time.monotonic()); every log closed. Ctrl-C kills them all (each is in its own session and did
    not get it)."""
    rcs = []
    try:
        for proc, _ in procs:
            try:
                rcs.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rcs.append(None)
    except BaseException:
        for proc, _ in procs:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise
    finally:
        for _, log in procs:
            log.close()
    return rcs


def run_tool(sanitizer: str, tool: str, log_dir: Path, tests=TESTS, print_limit=DEFAULT_PRINT_LIMIT, pytest_args=(),
             timeout_s=DEFAULT_TIMEOUT_S, cwd=None, shards: int = 1) -> ToolResult:
    """`tool` over `tests`, in `shards` processes at once (each a share of the tests, its log
    TOOL.log or TOOL.K.log), the shards' verdicts merged (`merge_shards`)."""
    groups = [g for g in (list(tests[i::shards]) for i in range(shards)) if g] if shards > 1 else [list(tests)]
    names = [f"{tool}.log"] if len(groups) == 1 else [f"{tool}.{k + 1}.log" for k in range(len(groups))]
    log_paths = [Path(log_dir) / name for name in names]
    env = tool_env(tool)
    start = time.perf_counter()
    procs = []
    try:
        for group, log_path in zip(groups, log_paths):
            procs.append(_start(build_command(sanitizer, tool, group, print_limit, pytest_args), log_path, env, cwd))
    finally:   # (a failed start: the ones started are still waited for, their logs closed)
        rcs = _wait_all(procs, time.monotonic() + timeout_s)
    seconds = time.perf_counter() - start
    results = [analyse(tool, path.read_text(encoding="utf-8", errors="replace"), rc, timeout_s=timeout_s,
                       log_path=path, seconds=seconds) for path, rc in zip(log_paths, rcs)]
    return results[0] if len(results) == 1 else merge_shards(tool, results)


def merge_shards(tool: str, shards: list) -> ToolResult:
    """One verdict of a tool's shards: pytest's counts added, each summary once (with the shards
    that gave it where they differ), reports by kernel added, each problem named by its shard."""
    r = ToolResult(tool, log_path=[s.log_path for s in shards], seconds=max(s.seconds for s in shards))
    rcs = [s.rc for s in shards]
    r.rc = None if None in rcs else max(rcs, key=abs)
    counts = Counter()
    for k, s in enumerate(shards, 1):
        counts.update(s.pytest_counts)
        r.kernels.update(s.kernels)
        r.problems += [f"shard {k}: {p}" for p in s.problems]
    r.pytest_counts = dict(counts)
    if all(s.pytest_line for s in shards):
        r.pytest_line = ", ".join(f"{n} {word}" for word, n in counts.items()) + f" in {len(shards)} shards"
    said = {}
    for k, s in enumerate(shards, 1):
        for summary in s.summaries:
            said.setdefault(summary, []).append(k)
    r.summaries = [summary if len(ks) == len(shards) else f"{summary} (shard{'s' if len(ks) > 1 else ''} "
                   f"{', '.join(map(str, ks))})" for summary, ks in said.items()]
    return r


def selected_tests(tests, pytest_args, cwd) -> tuple:
    """The ids of `tests` that pytest selects with `pytest_args` (-k, -m ...), collected without a
    sanitizer, so that shards share only tests that run (a shard with none would fail)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *pytest_args, *tests], cwd=cwd, capture_output=True, text=True)
    ids = tuple(line.strip() for line in r.stdout.splitlines() if "::" in line)
    if not ids:
        raise SanitizeError(f"pytest selected no test of the list with {shlex.join(pytest_args) or 'no arguments'}: "
                            f"{(r.stdout + r.stderr).strip()[-500:]}")
    return ids


def main(args, out=None, err=None) -> int:
    """The sanitize command: args from __main__'s parser (tool, log_dir, print_limit, timeout,
    pytest_args, dry_run)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        tools = parse_tools(args.tool)
        pytest_args = shlex.split(args.pytest_args or "")
        if args.dry_run:
            try:
                sanitizer = find_sanitizer()
            except SanitizerNotFound as e:
                print(f"note: {e}", file=err)
                sanitizer = "compute-sanitizer"
            for tool in tools:
                print(shlex.join(build_command(sanitizer, tool, TESTS, args.print_limit, pytest_args)), file=out)
            return 0
        sanitizer = find_sanitizer()
        root = source_root()
        shards = args.shards
        tests = TESTS if shards == 1 else selected_tests(TESTS, pytest_args, root)
    except (SanitizeError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="pykda-sanitize-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    at_once = f", {min(shards, len(tests))} processes at once" if shards > 1 else ""
    print(f"{len(tests)} tests under {sanitizer} ({', '.join(tools)}{at_once}); logs in {log_dir}", file=out,
          flush=True)
    results = []
    for i, tool in enumerate(tools, 1):
        logs = f"{tool}.log" if shards == 1 else f"{tool}.1.log .. {tool}.{min(shards, len(tests))}.log"
        print(f"[{i}/{len(tools)}] {tool}: running, log {log_dir / logs}", file=err, flush=True)
        r = run_tool(sanitizer, tool, log_dir, tests, args.print_limit, pytest_args, args.timeout, cwd=root,
                     shards=shards)
        results.append(r)
        print(r.line(), file=out, flush=True)
    failed = [r.tool for r in results if not r.ok]
    if failed:
        print(f"sanitize: FAILED ({', '.join(failed)}); logs in {log_dir}", file=out)
        return 1
    print(f"sanitize: clean ({', '.join(tools)}); logs in {log_dir}", file=out)
    return 0
