"""Batches of short sequences: the pipeline's chunks, the balanced split, decode_short, FlashInfer."""
import numpy as np
import torch
from pykda.bench import timing
from pykda.bench.decode import _flashinfer_peers, uneven_lengths
from pykda.ops.decode import flash_decode

timer, _ = timing.start("read")
ROWS = [(256, 32, 8, 64, 128, True), (256, 64, 8, 33, 128, True), (512, 32, 8, 64, 128, True),
        (256, 32, 8, 128, 128, True), (256, 32, 8, 256, 128, True), (128, 32, 8, 64, 64, True),
        (256, 32, 4, 32, 256, True), (64, 32, 8, 64, 128, True), (1024, 32, 8, 64, 128, True)]
print(f"{'shape':>24} {'chunks':>7} {'balanced':>8} {'short':>7} {'fi':>7} {'bal/ch':>7} {'fi/best':>7}")
for B, hq, hkv, S, d, uneven in ROWS:
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = uneven_lengths(B, S, seed=S + B)
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda()
    fns = {"chunks": lambda: flash_decode(q, k, v, batched=True, kv_layout="HND", kv_lens=kl, stages=3),
           "balanced": lambda: flash_decode(q, k, v, batched=True, kv_layout="HND", kv_lens=kl, balanced=True),
           "short": lambda: flash_decode(q, k, v, batched=True, kv_layout="HND", kv_lens=kl)}
    outs = {n: f().float() for n, f in fns.items()}
    diff = max((outs[n] - outs["chunks"]).abs().max().item() for n in outs)
    fi = _flashinfer_peers(q, k, v, lens, True).get("fi", (None,))[0]
    if fi is not None:
        fns["fi"] = fi
    t = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            t[n].append(timer.median_us(f, repeats=40))
    b = {n: min(x) for n, x in t.items()}
    best = min(b["chunks"], b["balanced"], b["short"])
    name = f"{B}x{hq}/{hkv}:{S}~:{d}"
    print(f"{name:>24} {b['chunks']:7.2f} {b['balanced']:8.2f} {b['short']:7.2f} {b.get('fi', float('nan')):7.2f} "
          f"{b['chunks'] / b['balanced']:7.3f} {b.get('fi', float('nan')) / best:7.3f}  diff {diff:.1e}", flush=True)
