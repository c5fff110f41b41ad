"""Pages of 16 in box-major tiles (one 5-D copy a page for every 64-column sub-tile) against the
tree before (one copy a page and sub-tile): `python ab.py OUT.json` times, with the pykda on
PYTHONPATH, `bench paged-decode --grid`'s rows on shuffled pages of 16 (HND and NHD) and the padded
kernel beside them, cold L2, median of 50; each paged output's largest distance from the padded
one. `python ab.py --table A.json B.json [A2.json B2.json ...]` prints the runs side by side."""
import functools
import json
import sys

import numpy as np


def measure(path: str) -> None:
    import torch

    import pykda
    from pykda.bench import timing
    from pykda.bench.decode import GRID, grid_inputs
    from pykda.bench.paged_decode import shuffled_pages
    timer, _ = timing.start("read")
    rows = {}
    for B, hq, hkv, D, S, uneven in [r for r in GRID if r[0] > 1]:
        q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven)
        kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
        padded = functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens)
        o_pad = padded().float()
        row = {"padded": timer.median_us(padded)}
        (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, 16, seed=16)
        for layout in ("HND", "NHD"):
            pages = (kp, vp) if layout == "HND" else tuple(x.transpose(1, 2).contiguous() for x in (kp, vp))
            dec = pykda.BatchDecodeWithPagedKVCache(layout)
            dec.plan(indptr, indices, last, hq, hkv, D, 16)
            run = functools.partial(dec.run, q, *pages)
            row[f"err_{layout}"] = float((run().float() - o_pad).abs().max())
            row[layout] = timer.median_us(run)
            del pages, dec, run
        tag = f"{B}x{hq}/{hkv} D{D} S{S}{'~' if uneven else ''}"
        rows[tag] = row
        print(f"{tag:>26} padded {row['padded']:8.2f}  HND {row['HND']:8.2f}  NHD {row['NHD']:8.2f}  "
              f"err {max(row['err_HND'], row['err_NHD']):.1e}", flush=True)
        del q, k, v, kp, vp
        torch.cuda.empty_cache()
        json.dump(rows, open(path, "w"), indent=1)   # after every row: a run cut short keeps its rows


def table(paths: list) -> None:
    runs = [json.load(open(p)) for p in paths]
    print(f"{'shape':>26} " + " ".join(f"{'pad':>7} {'HND':>7} {'NHD':>7} |" for _ in runs) + "  HND/pad  NHD/pad (each run)")
    tags = [t for t in runs[0] if all(t in r for r in runs)]   # the rows every run reached
    runs = [{t: r[t] for t in tags} for r in runs]
    for tag in tags:
        cells = " ".join(f"{r[tag]['padded']:7.2f} {r[tag]['HND']:7.2f} {r[tag]['NHD']:7.2f} |" for r in runs)
        ratios = " ".join(f"{r[tag]['HND'] / r[tag]['padded']:5.3f}/{r[tag]['NHD'] / r[tag]['padded']:5.3f}" for r in runs)
        print(f"{tag:>26} {cells}  {ratios}")
    for i, r in enumerate(runs):
        x = [r[t]["HND"] / r[t]["padded"] for t in r]
        print(f"run {i} ({paths[i]}): HND paged / padded min {min(x):.3f} median {np.median(x):.3f} max {max(x):.3f}; "
              f"largest |paged - padded| {max(max(r[t]['err_HND'], r[t]['err_NHD']) for t in r):.1e}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2:])
    else:
        measure(sys.argv[1])
