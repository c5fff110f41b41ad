"""Benchmarks: `python -m pykda bench OP` (needs a GPU and torch; peers where importable)."""
from __future__ import annotations

import json
import platform
import time


def settings(text: str | None) -> list:
    """A comma list of template-parameter settings to sweep; 0 (or nothing) is the planner's choice."""
    return [None] if not text else [int(x) or None for x in text.split(",")]


# the sweep and shape options each bench takes; any other given is an error, never ignored
OPTIONS = {"decode": ("chunk_size", "stages", "shapes"), "kda": (), "kda-decode": ("rows_per_thread", "stages")}


def check_options(args) -> None:
    """Raise ValueError naming an option given to a bench that does not take it."""
    for name in sorted(set().union(*OPTIONS.values())):
        if getattr(args, name, None) and name not in OPTIONS[args.op]:
            raise ValueError(f"bench {args.op} does not take --{name.replace('_', '-')}")


def main(args) -> int:
    check_options(args)
    from .. import runtime
    runtime.require_gpu()
    from . import decode, kda, kda_decode
    runner = {"decode": decode.run, "kda": kda.run, "kda-decode": kda_decode.run}[args.op]
    results = runner(args)
    meta = environment()
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "op": args.op, "results": results}, f, indent=1, default=str)
    print(f"\nwrote {args.json}")
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
