"""One-tile CTAs' paged rows (requests within a tile, more units than decode_tiny takes): pykda's
paged run on shuffled HND pages of 16, 64 and 128 rows and its padded kernel at the same lengths,
µs, cold L2, median of 50; each paged output's distance from the padded one. Run from the
repository root after `source .peers/activate.sh`, once per tree (the A/B alternates trees by
PYTHONPATH): `PYTHONPATH=. python docs/studies/paged_one_tile/ab.py`. With the argument
`gathers`, session 54's rows and pages of 1, 8, 16 and 64 instead (the rows the warps gather:
one-tile CTAs, and the streaming producer's pages of 1 and 8; docs/studies/pages_of_one)."""
import functools
import sys

import torch

import pykda
from pykda import reference
from pykda.bench import timing
from pykda.bench.decode import uneven_lengths
from pykda.bench.paged_decode import shuffled_pages
from pykda.ops import decode

timer, _ = timing.start("read")
SHAPES = [(256, 32, 8, 128, 64), (256, 32, 4, 256, 32), (256, 32, 8, 64, 64), (64, 32, 8, 128, 64),
          (32, 32, 8, 128, 64), (512, 32, 8, 128, 32), (256, 8, 1, 128, 64), (1024, 32, 8, 128, 64)]
PAGES = (16, 64, 128)
if sys.argv[1:] == ["gathers"]:
    SHAPES = [(256, 32, 4, 256, 32), (256, 32, 8, 128, 64), (512, 32, 8, 128, 32), (1024, 32, 8, 128, 64),
              (256, 32, 8, 64, 64), (256, 8, 1, 128, 64), (256, 8, 1, 128, 4096), (128, 32, 4, 256, 1024),
              (32, 32, 8, 128, 8192), (64, 32, 8, 64, 2048)]
    PAGES = (1, 8, 16, 64)
print(f"{'shape':>22} {'padded':>7} " + " ".join(f"{f'p{p}':>7}" for p in PAGES) + "  kernel (p16)   max err")
for B, hq, hkv, D, S in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(S + D + B)
    q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in "kv")
    lens = uneven_lengths(B, S, seed=B)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    padded = functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens)
    o_pad = padded().float().cpu().numpy()
    row, err = [timer.median_us(padded)], 0.0
    for page in PAGES:
        (kp, vp), indptr, indices, last = shuffled_pages((k, v), lens, page, seed=page)
        dec = pykda.BatchDecodeWithPagedKVCache("HND")
        dec.plan(indptr, indices, last, hq, hkv, D, page)
        run = functools.partial(dec.run, q, kp, vp)
        err = max(err, reference.relative_error(run().float().cpu().numpy(), o_pad))
        row.append(timer.median_us(run))
    plan, _ = decode.plan_for(decode.DecodeProblem(S, hq, hkv, D, "bfloat16", B), 0, None, None, 16, uneven=True,
                              balanced=None)
    kind = "tiny" if plan.tiny else ("one-tile" if plan.one_tile else "pipeline") if hasattr(plan, "one_tile") else \
        ("tiny" if plan.tiny else f"warps {plan.warps}")
    gather = plan.gathers(16) if hasattr(plan, "gathers") else False
    print(f"{f'{B}x{hq}/{hkv} D{D} S{S}~':>22} " + " ".join(f"{x:7.2f}" for x in row) +
          f"  {kind}{' gather' if gather else ''}   {err:.1e}")
