"""transposed.patch across the decode grid: every row whose group is at most 8 query heads, the
planner's plan built as today and TRANSPOSED, alternated three times (best of three medians of 40
calls, cold L2, HND buffers); `diff`: the largest distance between the two outputs. The grid's
peers are `bench decode --grid`'s (not timed here: their first builds take minutes). Run from the
repository root with PYTHONPATH=. and the patch applied (`git apply
docs/studies/decode_short/transposed.patch`; the kernels compile at first use)."""
import numpy as np
import torch

from pykda import runtime
from pykda.bench import timing
from pykda.bench.decode import GRID, uneven_lengths
from pykda.ops import decode
from pykda.runtime.arrays import CallArrays


def prepared_call(q, k, v, kl, batched, transposed):
    """A launch of the planner's plan for these arrays, its kernel built TRANSPOSED or not."""
    spec_of = decode.decode_spec
    if transposed:
        def with_transposed(p, plan, arch, page=0):
            s = spec_of(p, plan, arch, page)
            return runtime.KernelSpec.make(s.template, {**s.param_dict, "TRANSPOSED": 1}, arch, s.kernels)
        decode.decode_spec = with_transposed
    try:
        arrays = CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED)
        call = decode.prepare_decode(*arrays.views(), batched, "HND", None, None, None, None)
    finally:
        decode.decode_spec = spec_of
    return lambda: decode.launch(call, CallArrays((q, k, v, None, kl), decode.ARGUMENTS, decode.REQUIRED), None,
                                 None, False, 0 if kl is None else kl.data_ptr())


def main():
    timer, _ = timing.start("read")
    print(f"{'row':>24} {'today':>9} {'T':>9} {'T/today':>8} {'diff':>8}")
    for B, hq, hkv, d, S, uneven in GRID:
        if hq // hkv > 8:
            continue
        batched = B > 1
        g = torch.Generator(device="cuda").manual_seed(S + B)
        q = torch.randn(B, hq, d, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(B, hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(B, hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
        kl = torch.as_tensor(np.asarray(uneven_lengths(B, S, seed=S + B), np.int32)).cuda() if uneven else None
        if not batched:
            q, k, v = q[0], k[0], v[0]
        fns = {"today": prepared_call(q, k, v, kl, batched, False), "T": prepared_call(q, k, v, kl, batched, True)}
        diff = (fns["T"]().float() - fns["today"]().float()).abs().max().item()
        t = {n: [] for n in fns}
        for _ in range(3):
            for n, f in fns.items():
                t[n].append(timer.median_us(f, repeats=40))
        today, tr = min(t["today"]), min(t["T"])
        row = f"{B}x{hq}/{hkv}:{S}{'~' if uneven else ''}:{d}"
        print(f"{row:>24} {today:9.2f} {tr:9.2f} {tr / today:8.3f} {diff:8.1e}", flush=True)
        del q, k, v, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
