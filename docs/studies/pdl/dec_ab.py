"""Flash decoding µs (cold L2, CUDA events, median) at a few split shapes: decode_partial + decode_merge."""
import torch
import pykda
from pykda.bench.timing import Timer
timer = Timer("read")
for hq, hkv, S, B in [(32, 32, 8192, 1), (16, 16, 8192, 1), (32, 8, 4096, 8), (64, 8, 50000, 1)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (B, hq, 128) if B > 1 else (hq, 128)
    q = torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)
    kv = (B, S, hkv, 128) if B > 1 else (S, hkv, 128)
    k = torch.randn(*kv, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(*kv, generator=g, device="cuda").to(torch.bfloat16)
    f = (lambda: pykda.batch_decode_with_padded_kv_cache(q, k, v)) if B > 1 else (lambda: pykda.single_decode_with_kv_cache(q, k, v))
    us = min(timer.median_us(f, warmup=10, repeats=50) for _ in range(3))
    print(f"decode {hq}/{hkv} B={B} S={S}: {us:7.2f} us")
