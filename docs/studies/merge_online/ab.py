"""decode_merge reading each chunk's lse and o together and merging online (one round trip to the
partials) against the tree before (a pass for the max, then a second for the weighted sum):
`python ab.py OUT [--balanced | --cluster]` times, with the pykda on PYTHONPATH, every row of `bench decode
--grid` whose plan launches decode_merge (HND; single rows by single_decode, batches by the padded batch
with kv_lens where uneven; `--balanced`: the balanced splits only; `--cluster`: instead the splits merged
in thread block clusters), cold L2, median of 50, and keeps the outputs (OUT.json, OUT.pt).
`python ab.py --table A B [A2 B2 ...]` prints the runs side by side and the largest distance
between the first two runs' outputs."""
import json
import sys

import numpy as np


def measure(path: str, only: str = "") -> None:
    import torch

    import pykda
    from pykda.bench import timing
    from pykda.bench.decode import GRID, grid_inputs
    from pykda.ops import decode
    timer, _ = timing.start("read")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    smem = torch.cuda.get_device_properties(0).shared_memory_per_multiprocessor
    rows, outs = {}, {}
    for B, hq, hkv, D, S, uneven in GRID:
        p = decode.DecodeProblem(S, hq, hkv, D, "bfloat16", B)
        plan = decode.plan_decode(p, sms, smem, uneven=uneven, balanced=None if uneven else False)
        if not {"": plan.merge_launch, "--balanced": plan.balanced, "--cluster": plan.cluster}[only]:
            continue
        q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven)
        if B == 1:
            run = lambda: pykda.single_decode_with_kv_cache(q[0], k[0], v[0], kv_layout="HND")  # noqa: E731
        else:
            kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda") if uneven else None
            run = lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens)  # noqa: E731
        tag = f"{B}x{hq}/{hkv} D{D} S{S}{'~' if uneven else ''}"
        outs[tag] = run().float().cpu()
        rows[tag] = timer.median_us(run)
        how = ", balanced" if plan.balanced else f", clusters of {plan.cluster}" if plan.cluster else ""
        print(f"{tag:>26} {rows[tag]:9.2f} us  ({plan.n_chunks} chunks{how})", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
        json.dump(rows, open(path + ".json", "w"), indent=1)   # after every row: a run cut short keeps its rows
    torch.save(outs, path + ".pt")


def table(paths: list) -> None:
    import torch
    runs = [json.load(open(p + ".json")) for p in paths]
    tags = [t for t in runs[0] if all(t in r for r in runs)]
    print(f"{'shape':>26} " + " ".join(f"{p.rsplit('/', 1)[-1]:>9}" for p in paths) + "   B/A (each pair)")
    for tag in tags:
        ratios = " ".join(f"{runs[i + 1][tag] / runs[i][tag]:.3f}" for i in range(0, len(runs) - 1, 2))
        print(f"{tag:>26} " + " ".join(f"{r[tag]:9.2f}" for r in runs) + f"   {ratios}")
    for i in range(0, len(runs) - 1, 2):
        x = [runs[i + 1][t] / runs[i][t] for t in tags]
        print(f"pair {i // 2}: B/A min {min(x):.3f} median {np.median(x):.3f} max {max(x):.3f} over {len(x)} rows")
    a, b = torch.load(paths[0] + ".pt"), torch.load(paths[1] + ".pt")
    print(f"largest |B - A| over the outputs: {max(float((a[t] - b[t]).abs().max()) for t in a if t in b):.1e}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2:])
    else:
        measure(sys.argv[1], *sys.argv[2:3])
