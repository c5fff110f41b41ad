"""One-tile batches (issue 13) with the one-tile CTAs reshaped by patching the planner's constants:
tiles of 64 rows for sequences within 32 (ONE_TILE_SHORT_ROWS, the planner before branch
wip/tile32), whole tiles read instead of boxes of PADDED_BOX_ROWS rows (the planner before session
41), one consumer warp instead of two (ONE_TILE_WARPS); FlashInfer beside (same process, cold L2,
CUDA events, µs medians; the error is the max |Δ| from the planner's output). From the repository root after `source .peers/activate.sh`:
`python docs/studies/decode_short/knobs.py`."""
import contextlib

import torch

from pykda.bench import decode as bench, timing
from pykda.ops import decode

SHAPES = [(256, 32, 8, 64, 128), (512, 32, 8, 64, 128), (256, 32, 8, 128, 128), (256, 32, 4, 32, 256), (256, 32, 8, 32, 128),
          (256, 64, 8, 33, 128), (256, 32, 8, 64, 64), (64, 32, 8, 64, 128), (1, 32, 8, 17, 64)]
VARIANTS = {"planner": {}, "64-row tiles": dict(ONE_TILE_SHORT_ROWS=0), "whole tiles": dict(PADDED_BOX_ROWS=1 << 30),
            "1 warp": dict(ONE_TILE_WARPS=1)}


@contextlib.contextmanager
def patched(**attrs):
    saved = {n: getattr(decode, n) for n in attrs}

    def forget():
        decode.PREPARED.clear()
        decode.plan_decode.cache_clear()
    try:
        for n, v in attrs.items():
            setattr(decode, n, v)
        forget()
        yield
    finally:
        for n, v in saved.items():
            setattr(decode, n, v)
        forget()


def main():
    timer, _ = timing.start()
    bf = torch.bfloat16
    print(f"{'shape':>26} " + " ".join(f"{n:>17}" for n in VARIANTS) + f" {'fi':>7}")
    for B, hq, hkv, S, d in SHAPES:
        q = torch.randn(B, hq, d, dtype=bf, device="cuda")
        k, v = (torch.randn(B, hkv, S, d, dtype=bf, device="cuda") for _ in "kv")
        lens = torch.as_tensor(bench.uneven_lengths(B, S, seed=S + B), dtype=torch.int32).cuda()
        fn = lambda: decode.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=lens)  # noqa: E731
        ref = fn().float()
        cells = []
        for attrs in VARIANTS.values():
            try:
                with patched(**attrs):
                    err = (fn().float() - ref).abs().max().item()
                    cells.append(f"{timer.median_us(fn, repeats=100):7.1f} ({err:.0e})")
            except Exception as exc:
                cells.append(f"{type(exc).__name__[:17]:>17}")
        fi = bench._flashinfer_peers(q, k, v, lens.cpu().numpy(), True).get("fi", (None, None))[0]
        fi_us = f"{timer.median_us(fi, repeats=100):7.1f}" if fi else "      -"
        print(f"{B:>5} x {hq}/{hkv} KV {S:>3}~ D {d:>3} " + " ".join(f"{c:>17}" for c in cells) + f" {fi_us}")


if __name__ == "__main__":
    main()
