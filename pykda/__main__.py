"""Command line: `python -m pykda {demo, compile, render, bench, sanitize}`."""
from __future__ import annotations

import argparse
import ast
import sys

FAMILIES = ("decode", "kda", "kda_decode")   # registry.FAMILIES (not imported here: it loads the runtime)


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _param(text: str) -> tuple[str, str]:
    """A render parameter, KEY=VALUE."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. D=128)")
    return key, value


def _at_least_one(text: str) -> int:
    """A count of at least 1 (--jobs, --shards)."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of at least 1")
    return jobs


def _positive_seconds(text: str) -> float:
    """A number of seconds above 0 (--max-seconds)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return seconds


def cmd_compile(args) -> int:
    import time
    from . import registry, runtime
    start, specs, from_nvrtc, stacked = time.perf_counter(), registry.specs(args.family, args.arch), 0, 0
    for spec, cubin, seconds, from_disk in runtime.compile_specs(specs, args.jobs):
        where = "disk" if from_disk else "nvrtc"
        resources = runtime.kernel_resources(cubin)
        kernels = ", ".join(f"{name} {r.registers} regs" + (f" {r.stack_bytes} B stack" if r.stack_bytes else "")
                            for name, r in resources.items())
        print(f"{spec.template:<12} {spec.describe():<72} {seconds:7.3f} s {len(cubin):8d} B  ({where})  {kernels}")
        from_nvrtc += not from_disk
        stacked += sum(r.stack_bytes > 0 for r in resources.values())
    print(f"{len(specs)} specializations ({from_nvrtc} by NVRTC, {len(specs) - from_nvrtc} from the disk cache) in "
          f"{time.perf_counter() - start:.1f} s; kernels with a stack frame: {stacked}")
    return 0


def cmd_render(args) -> int:
    from . import runtime
    params = dict(args.params)
    try:
        source = runtime.render(args.name, {k: _value(v) for k, v in params.items()})
    except ValueError as exc:   # an unknown template or a missing parameter
        print(f"python -m pykda render: {exc}", file=sys.stderr)
        return 2
    print(source, end="")
    return 0


def cmd_demo(args) -> int:
    from . import demo
    return demo.main()


def cmd_sanitize(args) -> int:
    from . import sanitize
    return sanitize.main(args)


def cmd_bench(args) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pykda", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="serve a small hybrid stack (3 KDA : 1 attention layers): prefill, continuous-batching "
                                  "decode in a CUDA graph, checked against the float64 references")
    c = sub.add_parser("compile", help="compile every registered specialization offline (no GPU needed)")
    c.add_argument("--arch", default="sm_90a")
    c.add_argument("--family", default=None, choices=FAMILIES, help=f"{', '.join(FAMILIES)} (default: all)")
    c.add_argument("--jobs", type=_at_least_one, default=None,
                   help="NVRTC compiles at once, on threads (default: the CPUs this process may use, at most 8)")
    r = sub.add_parser("render", help="print a template's rendered CUDA source")
    r.add_argument("name")
    r.add_argument("params", nargs="*", type=_param, help="KEY=VALUE template parameters")
    s = sub.add_parser("sanitize", help="run a GPU test subset of every op under compute-sanitizer, one tool after "
                                         "another; a summary line per tool (needs the CUDA toolkit's compute-sanitizer)")
    s.add_argument("--tool", default="memcheck,racecheck,synccheck,initcheck",
                   help="comma list of compute-sanitizer tools, run in this order (default: all four)")
    s.add_argument("--log-dir", default=None, help="where each tool's full log goes (default: a new temp dir, printed)")
    s.add_argument("--print-limit", type=int, default=10000, help="compute-sanitizer --print-limit (reports per tool)")
    s.add_argument("--timeout", type=float, default=3600, help="seconds per tool before its run is killed (a failure)")
    s.add_argument("--pytest-args", default="",
                   help="extra pytest arguments, one string, e.g. --pytest-args='-x -k kda' (written with =)")
    s.add_argument("--shards", type=_at_least_one, default=1,
                   help="processes a tool runs in at once, each a share of the tests pytest selects (default 1)")
    s.add_argument("--dry-run", action="store_true", help="print each tool's command line and exit")
    b = sub.add_parser("bench", help="benchmarks against peers on the GPU")
    b.add_argument("op", choices=["decode", "kda", "kda-decode", "paged-decode"])
    b.add_argument("--chunk-size", default=None, help="decode: comma list of KV rows per chunk to sweep; kda: of the kernels' CHUNK (16, 32)")
    b.add_argument("--rows-per-thread", default=None,
                   help="kda-decode: comma list of state rows per lane group (1, 2, 4, 8) to sweep")
    b.add_argument("--stages", default=None, help="decode, kda, kda-decode: comma list of pipeline depths to sweep")
    b.add_argument("--warps", default=None,
                   help="kda: comma list of recurrence consumer warps (1, 2, 4, 8: V split in 16-row slices) to sweep")
    b.add_argument("--segment-chunks", default=None,
                   help="kda: comma list of chunks per segment to sweep (0: the serial chain; auto: the planner's)")
    b.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    b.add_argument("--grid", action="store_true",
                   help="decode: issue 13's grid of 42 shapes (head ratios, D 64/128/256, lengths 1..1M, uneven "
                        "batches) with a summary line: pykda against the best peer, worst and median; paged-decode: "
                        "the grid's batches on shuffled pages of 16, 64 and 1 rows against FlashInfer's paged wrapper")
    b.add_argument("--shapes", default=None,
                   help="decode, kda, paged-decode: shapes to run instead of the bench's own. decode: HQ/HKV:KV_LEN or "
                        "BATCHxHQ/HKV:KV_LEN (the padded-batch op), each with an optional :HEAD_DIM (default 128), e.g. "
                        "32/8:100000,8x32/8:32768,16/16:100003:64; paged-decode: BATCHxHQ/HKV:KV_LEN; kda: "
                        "H:LENGTHS, the sequence lengths joined by + (LENxN repeats one), e.g. 4:262144,8:131072+1024x63")
    b.add_argument("--flush", choices=["read", "write"], default="read",
                   help="evict the L2 before each timed call by reading (clean lines, default) or by "
                        "overwriting (dirty lines the timed call must write back) a 1 GiB buffer")
    b.add_argument("--json", default="pykda-bench.json", help="where to write the results")
    b.add_argument("--max-seconds", type=_positive_seconds, default=None,
                   help="take no new shape after this many seconds from the bench's start: the rows measured by "
                        "then are printed and written (a time limit on the run still leaves a table)")
    b.add_argument("--plot", default=None, metavar="FILE.png",
                   help="decode, kda-decode sweeps: also draw kernel µs and TB/s against the swept setting, a line "
                        "per shape, its peer dashed (needs matplotlib: the plot extra, pip install 'pykda[plot]'). "
                        "Progress bars need tqdm: the progress extra")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return {"demo": cmd_demo, "compile": cmd_compile, "render": cmd_render, "bench": cmd_bench,
            "sanitize": cmd_sanitize}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
