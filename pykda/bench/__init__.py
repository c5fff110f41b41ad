"""Benchmarks: `python -m pykda bench OP` (needs a GPU and torch; peers where importable)."""
from __future__ import annotations

import json
import platform
import time


def main(args) -> int:
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
