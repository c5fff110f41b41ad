"""One long memory-bound decode row, pykda's kernels or cuDNN's (SDPA), three calls: run under ncu
(`ncu_round.sh`) to see each kernel's duration and DRAM rate. argv: who (pykda, cudnn), Hq, Hkv, S, D."""
import sys

import torch

import pykda

who, hq, hkv, s, d = sys.argv[1], *map(int, sys.argv[2:6])
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(hq, d, device="cuda", generator=g).to(torch.bfloat16)
k = torch.randn(hkv, s, d, device="cuda", generator=g).to(torch.bfloat16)   # HND, as the grid's peers read it
v = torch.randn(hkv, s, d, device="cuda", generator=g).to(torch.bfloat16)
if who == "pykda":
    call = lambda: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND")  # noqa: E731
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q4, k4, v4 = q.view(1, hq, 1, d), k.view(1, hkv, s, d), v.view(1, hkv, s, d)

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=hq != hkv)
for _ in range(3):
    call()
torch.cuda.synchronize()
