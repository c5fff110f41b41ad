"""Batches of short sequences (one 64-row tile each) through the pipeline kernel at more CTAs an SM:
fewer stages (a one-tile CTA uses one) and `__launch_bounds__(160, MIN_CTAS)` (needs
`git apply docs/studies/decode_short/occupancy.patch`; the kernels compile at first use), beside
the default chunks, the balanced split and FlashInfer. Same process, cold L2, best of three
alternated medians. Run from the repository root with PYTHONPATH=. (and the peers activated)."""
import numpy as np
import torch

from pykda import runtime
from pykda.bench import timing
from pykda.bench.decode import _flashinfer_peers, uneven_lengths
from pykda.ops import decode
from pykda.runtime.arrays import CallArrays

timer, _ = timing.start("read")
# (B, Hq, Hkv, longest S, D); lengths uneven 1..S
ROWS = [(256, 32, 8, 64, 128), (512, 32, 8, 64, 128), (256, 64, 8, 33, 128), (64, 32, 8, 64, 128),
        (256, 32, 8, 64, 64), (256, 32, 4, 32, 256), (256, 32, 8, 128, 128)]
# (label, stages, MIN_CTAS); stages 1 bypasses check_stages (a one-tile CTA fills one stage)
VARIANTS = {128: [("3 st", 3, 0), ("2 st", 2, 0), ("2 st x3", 2, 3), ("1 st x3", 1, 3)],
            64: [("3 st", 3, 0), ("2 st", 2, 0), ("1 st x4", 1, 4), ("1 st x6", 1, 6)],
            256: [("3 st", 3, 0), ("1 st", 1, 0), ("1 st x2", 1, 2)]}


def variant_call(q, k, v, kl, stages, min_ctas):
    """A launch of the planner's chunked plan at `stages`, compiled with MIN_CTAS (0: none)."""
    spec_of, check = decode.decode_spec, decode.check_stages
    if min_ctas:
        def with_min_ctas(p, plan, arch, page=0):
            s = spec_of(p, plan, arch, page)
            return runtime.KernelSpec.make(s.template, {**s.param_dict, "MIN_CTAS": min_ctas}, arch, s.kernels)
        decode.decode_spec = with_min_ctas
    decode.check_stages = lambda s: None
    try:
        arrays = CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED)
        call = decode.prepare_decode(*arrays.views(), True, "HND", None, None, stages, False)
    finally:
        decode.decode_spec, decode.check_stages = spec_of, check
    return lambda: decode.launch(call, CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED), None,
                                 None, False, kl.data_ptr())


for B, hq, hkv, S, d in ROWS:
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = uneven_lengths(B, S, seed=S + B)
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda()
    fns = {label: variant_call(q, k, v, kl, st, mc) for label, st, mc in VARIANTS[d]}
    fns["balanced"] = lambda: decode.flash_decode(q, k, v, batched=True, kv_layout="HND", kv_lens=kl, balanced=True)
    ref = fns["3 st"]().float()
    diff = max((f().float() - ref).abs().max().item() for f in fns.values())
    fi = _flashinfer_peers(q, k, v, lens, True).get("fi", (None,))[0]
    if fi is not None:
        fns["fi"] = fi
    t = {n: [] for n in fns}
    for _ in range(3):
        for n, f in fns.items():
            t[n].append(timer.median_us(f, repeats=40))
    cells = "  ".join(f"{n} {min(x):.2f}" for n, x in t.items())
    print(f"{B}x{hq}/{hkv}:{S}~:{d}  {cells}  diff {diff:.1e}", flush=True)
