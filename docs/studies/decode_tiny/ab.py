"""decode_tiny (short padded calls of few CTAs, CUDA cores, no pipeline) against the pipeline kernel
it replaces (decode_partial's one-tile plan: `chunk_size=64`: what the planner picked before) and
FlashInfer's single / batch decode on both of its paths; "tiny" in 8 row streams, "tiny4" in 4, both
past the planner's limit of units an SM; the last column what the planner runs. µs, cold L2, median of 50. Run after `source .peers/activate.sh`: `python ab.py`."""
import functools

import torch

import pykda
from pykda.bench import timing
from pykda.ops import decode

try:
    import flashinfer
except ImportError:
    flashinfer = None


DEFAULTS = decode.TINY_MAX_ROWS_PER_SM, decode.TINY_STREAMS


def limits(rows_per_sm: int, streams: tuple[int, int]):
    """Calls made after this take decode_tiny within `rows_per_sm` kernel rows an SM, in `streams` row
    streams (TINY_STREAMS' pair)."""
    decode.TINY_MAX_ROWS_PER_SM, decode.TINY_STREAMS = rows_per_sm, streams
    decode.plan_decode.cache_clear()
    decode.PREPARED.clear()


def fi_batch(q, k, v, lens, tc):
    """FlashInfer's batch decode over pages of the whole padded length (one page a sequence, its
    last page holding its length)."""
    B, hkv, S, D = k.shape
    i32 = functools.partial(torch.tensor, dtype=torch.int32, device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
    w.plan(i32(list(range(B + 1))), i32(list(range(B))), i32([max(n, 1) for n in lens]), q.shape[1], hkv, D, S,
           q_data_type=q.dtype, kv_data_type=k.dtype)
    return lambda: w.run(q, (k, v))


timer, _ = timing.start("read")
SHAPES = [  # (batch, Hq, Hkv, D, S); batch > 1: lengths uniform in 1..S (kv_lens)
    (1, 32, 8, 64, 1), (1, 32, 8, 64, 17), (1, 32, 8, 64, 32), (1, 32, 8, 128, 17), (1, 32, 8, 128, 32),
    (1, 32, 8, 256, 17), (1, 32, 32, 128, 17), (1, 64, 8, 128, 32), (1, 8, 1, 128, 17),
    (4, 32, 8, 128, 32), (16, 32, 8, 128, 32), (16, 32, 8, 64, 17), (32, 32, 8, 128, 32), (64, 32, 8, 128, 32),
    (1, 32, 8, 64, 48), (1, 32, 8, 64, 64), (1, 32, 8, 128, 64), (4, 32, 8, 128, 64), (16, 32, 8, 128, 64), (32, 32, 8, 128, 64)]
NAMES = ("tiny", "tiny4", "pipe", "fi", "fi-tc")
print(f"{'shape':>22} " + " ".join(f"{n:>7}" for n in NAMES) + "   planner (rows, streams)")
for B, hq, hkv, D, S in SHAPES:
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(S + D + B)
    q = torch.randn(B, hq, D, dtype=bf, device="cuda", generator=g)
    k, v = (torch.randn(B, hkv, S, D, dtype=bf, device="cuda", generator=g) for _ in "kv")
    lens = [S] if B == 1 else torch.randint(1, S + 1, (B,), generator=torch.Generator().manual_seed(B)).tolist()
    kv_lens = None if B == 1 else torch.tensor(lens, dtype=torch.int32, device="cuda")
    if B == 1:
        ours = lambda **kw: pykda.single_decode_with_kv_cache(q[0], k[0], v[0], kv_layout="HND", **kw)  # noqa: E731
    else:
        ours = lambda **kw: pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens,  # noqa: E731
                                                                    **kw)
    row = {"tiny": ours, "tiny4": ours, "pipe": functools.partial(ours, chunk_size=64)}
    if flashinfer is not None:
        for name, tc in (("fi", False), ("fi-tc", True)):
            row[name] = (functools.partial(flashinfer.single_decode_with_kv_cache, q[0], k[0], v[0], kv_layout="HND",
                                           use_tensor_cores=tc) if B == 1 else fi_batch(q, k, v, lens, tc))
    ref = row["pipe"]().float()
    us = {}
    for name, fn in row.items():
        limits(256, (4, 4) if name == "tiny4" else (8, 8))
        out = fn()
        err = ((out.reshape(ref.shape).float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (name, B, hq, hkv, D, S, err)
        us[name] = timer.median_us(fn, warmup=5, repeats=50)
    limits(*DEFAULTS)
    plan = decode.plan_decode(decode.DecodeProblem(S, hq, hkv, D, "bfloat16", B), 132, 233472, uneven=B > 1,
                              balanced=None, tiny=True)
    planned = f"tiny ({plan.block_n}, {plan.streams})" if plan.tiny else "pipe"
    shape = f"{B}x{hq}/{hkv} D{D} S{S}"
    print(f"{shape:>22} " + " ".join(f"{us.get(n, float('nan')):7.2f}" for n in NAMES) + f"   {planned}", flush=True)
