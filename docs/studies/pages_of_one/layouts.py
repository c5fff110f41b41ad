"""Why pages of one row can beat the padded kernel (session 53's open row: 256 x 32/4 KV 32~ D 256,
18.0 µs on pages of 1 against 19.9 padded). The same batch, µs (cold L2, medians of 50), as:
the padded cache HND [B, Hkv, S, D] and NHD [B, S, Hkv, D] (a row of every KV head side by side,
as a page of one row holds them), pages of 1 in the requests' order and shuffled, pages of 16
shuffled; each output against the padded HND one. Two rounds. From the repository root after
`source .peers/activate.sh`: `PYTHONPATH=. python docs/studies/pages_of_one/layouts.py`."""
import functools

import torch

import pykda
from pykda import reference
from pykda.bench import timing
from pykda.bench.decode import uneven_lengths
from pykda.bench.paged_decode import shuffled_pages
from pykda.ops import decode

timer, _ = timing.start("read")
SHAPES = [(256, 32, 4, 256, 32), (256, 32, 8, 128, 64), (512, 32, 8, 128, 32), (1024, 32, 8, 128, 64),
          (256, 32, 8, 64, 64), (256, 8, 1, 128, 64), (64, 32, 8, 128, 64), (256, 8, 1, 128, 4096),
          (128, 32, 4, 256, 1024), (256, 64, 8, 128, 513)]
COLS = ("HND", "NHD", "p1 order", "p1 shuf", "p16 shuf")


def in_order(xs, lens):
    """Pages of one row in the requests' order: row r of request b at page indptr[b] + r."""
    (pages, indptr, _, last) = shuffled_pages(xs, lens, 1, seed=0)
    n = sum(int(x) for x in lens)
    ordered = [torch.cat([x[b, :, :int(lens[b])].transpose(0, 1) for b in range(len(lens))]).unsqueeze(2)
               for x in xs]   # [P, Hkv, 1, D]
    return ordered, indptr, torch.arange(n, dtype=torch.int32, device=xs[0].device), last


def calls(B, hq, hkv, D, S):
    g = torch.Generator(device="cuda").manual_seed(S + D + B)
    q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16) for _ in "kv")
    lens = uneven_lengths(B, S, seed=B)
    kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda")
    kn, vn = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    out = {"HND": functools.partial(pykda.batch_decode_with_padded_kv_cache, q, k, v, kv_layout="HND", kv_lens=kv_lens),
           "NHD": functools.partial(pykda.batch_decode_with_padded_kv_cache, q, kn, vn, kv_layout="NHD", kv_lens=kv_lens)}
    for name, (pages, indptr, indices, last), page in (
            ("p1 order", in_order((k, v), lens), 1), ("p1 shuf", shuffled_pages((k, v), lens, 1, seed=1), 1),
            ("p16 shuf", shuffled_pages((k, v), lens, 16, seed=16), 16)):
        dec = pykda.BatchDecodeWithPagedKVCache("HND")
        dec.plan(indptr, indices, last, hq, hkv, D, page)
        out[name] = functools.partial(dec.run, q, *pages)
    return out


print(f"{'shape':>22} " + " ".join(f"{c:>9}" for c in COLS) + "  kernel   max err")
made = [(s, calls(*s)) for s in SHAPES]
for rnd in range(2):
    for (B, hq, hkv, D, S), fns in made:
        ref = fns["HND"]().float().cpu().numpy()
        err = max(reference.relative_error(fns[c]().float().cpu().numpy(), ref) for c in COLS[1:])
        plan, _ = decode.plan_for(decode.DecodeProblem(S, hq, hkv, D, "bfloat16", B), 0, None, None, 16, uneven=True,
                                  balanced=None)
        kind = "tiny" if plan.tiny else ("one-tile" if plan.one_tile else "pipeline")
        print(f"{f'{B}x{hq}/{hkv} D{D} S{S}~':>22} " + " ".join(f"{timer.median_us(fns[c]):9.2f}" for c in COLS) +
              f"  {kind}  {err:.1e}", flush=True)
