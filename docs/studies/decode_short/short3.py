"""Batches of short sequences (one 64-row tile each) through the pipeline kernel at more CTAs an SM:
fewer stages (a one-tile CTA uses one), `__launch_bounds__(THREADS, MIN_CTAS)` (needs
`git apply docs/studies/decode_short/occupancy.patch`; the kernels compile at first use) and two
consumer warps instead of four (96 threads: at D 128, 168 registers let four CTAs share an SM's
registers where four warps' 157 let two) and the transposed products (`T`: needs
`git apply docs/studies/decode_short/transposed.patch`; 95 registers at D 128), beside the
default chunks, the balanced split and FlashInfer. Same process, cold L2, best of three alternated medians; `diff`: the largest distance
of any variant's output from the default's. Run from the repository root with PYTHONPATH=. (and
the peers activated)."""
import numpy as np
import torch

from pykda import runtime
from pykda.bench import timing
from pykda.bench.decode import _flashinfer_peers, uneven_lengths
from pykda.ops import decode
from pykda.runtime.arrays import CallArrays

timer, _ = timing.start("read")
# (B, Hq, Hkv, longest S, D); lengths uneven 1..S (B = 1: S rows, no kv_lens, as a single sequence's call)
ROWS = [(256, 32, 8, 64, 128), (512, 32, 8, 64, 128), (256, 64, 8, 33, 128), (64, 32, 8, 64, 128),
        (256, 32, 8, 64, 64), (256, 32, 4, 32, 256), (256, 32, 8, 128, 128), (1, 32, 8, 17, 64)]
# (label, stages, MIN_CTAS, consumer warps, TRANSPOSED); stages 1 bypasses check_stages (a one-tile CTA fills one
# stage). Registers / stack bytes (NVRTC 13.0, offline): D 128 four warps 157 / 0, x3 128 / 64; two
# warps 168 / 0 at 3 stages, 216 / 0 at 1, 168 / 24 at 1 x4; D 64 two warps 127 / 0, x6 96 / 8;
# D 256 two warps 255 / 24; one warp (no merge between warps) D 64 128 / 0, D 128 236 / 0.
# TRANSPOSED (groups <= 8): D 64 72 (one warp 125), D 128 95 (two warps 128, one stage 96), D 256 167 (two
# warps 163)
VARIANTS = {128: [("3 st", 3, 0, 4, 0), ("2 st", 2, 0, 4, 0), ("2 st x3", 2, 3, 4, 0), ("1 st x3", 1, 3, 4, 0),
                  ("2w 2 st", 2, 0, 2, 0), ("2w 1 st", 1, 0, 2, 0), ("2w 1 st x4", 1, 4, 2, 0), ("1w 1 st", 1, 0, 1, 0),
                  ("T 3 st", 3, 0, 4, 1), ("T 2 st", 2, 0, 4, 1), ("T 1 st", 1, 0, 4, 1), ("T 2w 1 st", 1, 0, 2, 1)],
            64: [("3 st", 3, 0, 4, 0), ("2 st", 2, 0, 4, 0), ("1 st x4", 1, 4, 4, 0), ("1 st x6", 1, 6, 4, 0),
                 ("2w 1 st", 1, 0, 2, 0), ("2w 1 st x6", 1, 6, 2, 0), ("1w 1 st", 1, 0, 1, 0),
                 ("T 3 st", 3, 0, 4, 1), ("T 1 st", 1, 0, 4, 1), ("T 2w 1 st", 1, 0, 2, 1), ("T 1w 1 st", 1, 0, 1, 1)],
            256: [("3 st", 3, 0, 4, 0), ("1 st", 1, 0, 4, 0), ("1 st x2", 1, 2, 4, 0), ("2w 1 st", 1, 0, 2, 0),
                  ("T 3 st", 3, 0, 4, 1), ("T 1 st", 1, 0, 4, 1)]}


def variant_call(q, k, v, kl, stages, min_ctas, warps, transposed):
    """A launch of the planner's chunked plan at `stages` and `warps` consumer warps, compiled with
    MIN_CTAS (0: none) and TRANSPOSED."""
    spec_of, check, default_warps = decode.decode_spec, decode.check_stages, decode.WARPS
    extra = {"WARPS": warps, **({"MIN_CTAS": min_ctas} if min_ctas else {}),
             **({"TRANSPOSED": 1} if transposed else {})}

    def with_extra(p, plan, arch, page=0):   # (decode_spec is memoized on the plan: its WARPS is the module's)
        s = spec_of(p, plan, arch, page)
        return runtime.KernelSpec.make(s.template, {**s.param_dict, **extra}, arch, s.kernels)
    decode.decode_spec = with_extra
    decode.check_stages = lambda s: None
    decode.WARPS = warps   # the launch's (warps + 1) · 32 threads
    try:
        arrays = CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED)
        call = decode.prepare_decode(*arrays.views(), True, "HND", None, None, stages, False)
    finally:
        decode.decode_spec, decode.check_stages, decode.WARPS = spec_of, check, default_warps
    return lambda: decode.launch(call, CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED), None,
                                 None, False, 0 if kl is None else kl.data_ptr())


for B, hq, hkv, S, d in ROWS:
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, S, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = uneven_lengths(B, S, seed=S + B)
    kl = torch.as_tensor(np.asarray(lens, np.int32)).cuda() if B > 1 else None
    fns = {label: variant_call(q, k, v, kl, *variant) for label, *variant in VARIANTS[d]}
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
