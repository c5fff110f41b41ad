"""kda_decode's speculative steps of fp32 states (2-D state_indices) and SGLang's target verify:
built for three CTAs an SM (MIN_CTAS 3, 128 registers) they keep 8-32 bytes a thread on the
stack (`python -m pykda compile`); built for two (MIN_CTAS 2) they take 146-155 registers and
keep none. Each row as main plans it, and with `min_ctas` giving two for those kernels (plans and
prepared calls cleared), alternated three times: best of three medians of 40 calls, cold L2;
`diff`: the largest distance between the two outputs (each step on its own copy of the pool).
Run from the repository root with PYTHONPATH=. (the MIN_CTAS 2 kernels compile at first use)."""
import torch

from pykda.bench import timing
from pykda.bench.kda_decode import FLAGS, _inputs
from pykda.ops import kda_decode
from pykda.ops.checks import Memo
from pykda.ops.kda_decode import fused_recurrent_kda

MAIN = kda_decode.min_ctas


def two_for_fp32_rows(state_dtype, rpt):
    """min_ctas with two CTAs an SM where main's gives three to fp32 states (the speculative kernels)."""
    return 2 if state_dtype == "float32" and MAIN(state_dtype, rpt) == 3 else MAIN(state_dtype, rpt)


def under(min_ctas, make):
    """make()'s step prepared with the planner's min_ctas replaced, into prepared calls of its own
    (swapped in at each call, so that neither variant re-plans the other's), and its plan."""
    own = Memo(kda_decode.PREPARED.make)
    main = kda_decode.PREPARED
    kda_decode.min_ctas, kda_decode.PREPARED = min_ctas, own
    for cached in (kda_decode.plan_kda_decode, kda_decode.kda_decode_spec):
        cached.cache_clear()
    try:
        f, plan = make()
    finally:
        kda_decode.min_ctas, kda_decode.PREPARED = MAIN, main
        for cached in (kda_decode.plan_kda_decode, kda_decode.kda_decode_spec):
            cached.cache_clear()

    def call():
        kda_decode.PREPARED = own
        try:
            return f()
        finally:
            kda_decode.PREPARED = main
    return call, plan


def step(B, H, T, gate, pool_dtype="float32"):
    """A speculative step of T tokens a sequence (num_accepted_tokens cycling 1..T) on its own pool."""
    x, pool, idx = _inputs(B, H, pool_dtype, gate, T)
    accepted = torch.arange(B, device="cuda", dtype=torch.int32) % T + 1

    def make():
        own = pool.clone()
        f = lambda: fused_recurrent_kda(**x, **FLAGS[gate], state_v_first=True, initial_state=own,  # noqa: E731
                                        state_indices=idx, num_accepted_tokens=accepted)[0]
        f()
        return f, kda_decode.PREPARED.last[1].plan
    return make


ROWS = [(f"B{B} H{H} T{T} {gate}", step(B, H, T, gate)) for B, H, T, gate in (
    (64, 32, 4, "softplus"), (64, 32, 4, "safe"), (64, 32, 8, "vllm"), (256, 32, 4, "softplus"), (64, 8, 4, "softplus"),
    (16, 32, 4, "softplus"))]


def main():
    timer, _ = timing.start("read")
    print(f"{'row':>24} {'3 CTAs':>9} {'2 CTAs':>9} {'2/3':>7} {'diff':>8}  plans")
    for label, make in ROWS:
        (f3, plan3), (f2, plan2) = under(MAIN, make), under(two_for_fp32_rows, make)
        diff = (f2().float() - f3().float()).abs().max().item()
        t = {3: [], 2: []}
        for _ in range(3):
            t[3].append(timer.median_us(f3, repeats=40))
            t[2].append(timer.median_us(f2, repeats=40))
        a, b = min(t[3]), min(t[2])
        print(f"{label:>24} {a:9.2f} {b:9.2f} {b / a:7.3f} {diff:8.1e}  {plan3} | {plan2}", flush=True)


if __name__ == "__main__":
    main()
