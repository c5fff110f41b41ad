"""Batches of short and uneven sequences (issue 13): the planner against whole tiles everywhere
(PADDED_BOX_ROWS patched; the planner before session 41), FlashInfer beside (same process, cold
L2, CUDA events, µs medians; the error is the max |Δ| from the planner's output). From the
repository root after `source .peers/activate.sh`: `python docs/studies/decode_short/knobs.py`; with
`PYTHONPATH=<an older tree>` first, the same table for that tree's planner."""
import contextlib

import torch

from pykda.bench import decode as bench, timing
from pykda.ops import decode

SHAPES = [(256, 32, 8, 64, 128), (256, 32, 8, 32, 128), (256, 32, 4, 32, 256), (256, 32, 8, 128, 128),
          (256, 32, 8, 256, 128), (256, 64, 8, 513, 128), (64, 32, 8, 1024, 128), (128, 16, 16, 3000, 128),
          (128, 32, 4, 1024, 256), (16, 32, 32, 8191, 128), (32, 32, 8, 8192, 64), (256, 8, 1, 4096, 128)]
VARIANTS = {"planner": {}, "whole tiles": dict(PADDED_BOX_ROWS=1 << 30)}


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
        print(f"{B:>5} x {hq}/{hkv} KV {S:>4}~ D {d:>3} " + " ".join(f"{c:>17}" for c in cells) + f" {fi_us}")


if __name__ == "__main__":
    main()
