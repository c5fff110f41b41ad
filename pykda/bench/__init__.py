"""Benchmarks: `python -m pykda bench OP` (needs a GPU and torch; peers where importable)."""
from __future__ import annotations

import json
import platform
import time

from . import plot


def settings(text: str | None, zero=None) -> list:
    """A comma list of settings to sweep; "auto" (or nothing) is the planner's choice, and so is 0
    unless `zero` says what 0 means (e.g. segment_chunks=0: no segments)."""
    if not text:
        return [None]
    try:
        return [None if x.strip() == "auto" else int(x) or zero for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of ints and auto") from None


# the template and planner parameters each bench sweeps
SWEEPS = {"decode": ("chunk_size", "stages"), "kda": ("chunk_size", "warps", "stages", "segment_chunks"),
          "kda-decode": ("rows_per_thread", "stages"), "paged-decode": ()}
# the sweep, shape and plot options each bench takes; any other given is an error, never ignored
OPTIONS = {"decode": SWEEPS["decode"] + ("shapes", "plot", "grid"), "kda": SWEEPS["kda"] + ("shapes",),
           "kda-decode": SWEEPS["kda-decode"] + ("plot",), "paged-decode": ("shapes", "grid")}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_options(args) -> None:
    """Raise ValueError naming an option given to a bench that does not take it, --plot
    without a sweep option, or a sweep option that is not a list of settings."""
    for name in sorted(set().union(*OPTIONS.values())):
        if getattr(args, name, None) and name not in OPTIONS[args.op]:
            raise ValueError(f"bench {args.op} does not take {_flag(name)}")
    if getattr(args, "plot", None) and not any(getattr(args, name, None) for name in SWEEPS[args.op]):
        raise ValueError(f"--plot draws a sweep: give {' or '.join(map(_flag, SWEEPS[args.op]))}")
    for name in SWEEPS[args.op]:
        try:
            settings(getattr(args, name, None))
        except ValueError as exc:
            raise ValueError(f"{_flag(name)}: {exc}") from None


def main(args) -> int:
    try:
        check_options(args)
    except ValueError as exc:
        raise SystemExit(f"python -m pykda bench: {exc}") from None
    if getattr(args, "plot", None):
        plot.require()   # before any GPU work
    from .. import runtime
    runtime.require_gpu()
    from . import decode, kda, kda_decode, paged_decode, timing
    timing.set_max_seconds(getattr(args, "max_seconds", None))
    bench = {"decode": decode, "kda": kda, "kda-decode": kda_decode, "paged-decode": paged_decode}[args.op]
    results = bench.run(args)
    meta = environment()
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "op": args.op, "results": results}, f, indent=1, default=str)
    print(f"\nwrote {args.json}")
    if getattr(args, "plot", None):
        bench.plot(results, args.plot, meta.get("device"))
        print(f"wrote {args.plot}")
    return 0


def environment() -> dict:
    import cupy
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(),
            "cupy": cupy.__version__}
    try:
        import torch
        info.update(torch=torch.__version__, device=torch.cuda.get_device_name())
    except ImportError:
        pass
    return info
