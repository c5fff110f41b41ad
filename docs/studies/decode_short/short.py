"""decode_short against the pipeline (stages given) and FlashInfer, same process, cold L2, alternated."""
import numpy as np
import torch
from pykda.bench import timing
from pykda.bench.decode import _flashinfer_peers, _pykda, uneven_lengths
from pykda.ops import decode

timer, _ = timing.start("read")
ROWS = [(1, 32, 8, 1, 64, False), (1, 32, 8, 16, 64, False), (1, 32, 8, 17, 64, False), (1, 32, 8, 32, 64, False),
        (1, 32, 8, 48, 64, False), (1, 32, 8, 64, 64, False), (1, 32, 8, 17, 128, False), (1, 32, 8, 64, 128, False),
        (1, 32, 8, 32, 256, False), (1, 8, 1, 1, 64, False), (1, 32, 32, 1, 128, False), (1, 32, 32, 64, 128, False),
        (1, 64, 4, 64, 128, False), (1, 128, 8, 33, 128, False),
        (4, 32, 8, 17, 128, True), (64, 32, 8, 64, 128, True), (256, 32, 8, 64, 128, True), (256, 64, 8, 33, 128, True),
        (128, 8, 8, 64, 128, False), (256, 32, 32, 64, 128, False), (512, 32, 8, 64, 128, True), (256, 32, 4, 32, 256, True)]
print(f"{'shape':>24} {'short':>7} {'pipe':>7} {'fi':>7} {'fi-tc':>7} {'pipe/short':>10} {'best fi/short':>13}")
for B, hq, hkv, S, d, uneven in ROWS:
    batched = B > 1
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = uneven_lengths(B, S, seed=S + B) if uneven else None
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda() if uneven else None
    short = _pykda(q, k, v, batched, "HND", None, None, kl)
    pipe = _pykda(q, k, v, batched, "HND", None, decode.DEFAULT_STAGES[d], kl)
    o_s, o_p = short(), pipe()
    diff = (o_s.float() - o_p.float()).abs().max().item()
    peers = _flashinfer_peers(q, k, v, lens, batched)
    fns = [("short", short), ("pipe", pipe)] + [(n, f) for n, (f, _) in peers.items() if f is not None]
    t = {n: [] for n, _ in fns}
    for _ in range(3):
        for n, f in fns:
            t[n].append(timer.median_us(f, repeats=40))
    best = {n: min(x) for n, x in t.items()}
    fi = min([best[n] for n in ("fi", "fi-tc") if n in best] or [float("nan")])
    name = f"{B}x{hq}/{hkv}:{S}{'~' if uneven else ''}:{d}"
    print(f"{name:>24} {best['short']:7.2f} {best['pipe']:7.2f} {best.get('fi', float('nan')):7.2f} "
          f"{best.get('fi-tc', float('nan')):7.2f} {best['pipe'] / best['short']:10.3f} {fi / best['short']:13.3f}"
          f"  diff {diff:.1e}", flush=True)
