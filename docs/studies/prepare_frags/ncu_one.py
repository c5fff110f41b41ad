"""Two chunk_kda calls at H=96 T=8192, Kimi Linear's softplus gate (ncu profiles the second kda_prepare)."""
import torch

import pykda
from pykda.bench.kda import FLAGS, _inputs

x, params, _, _ = _inputs(96, [8192], False)
for _ in range(2):
    pykda.chunk_kda(*(x[n] for n in ("q", "k", "v", "g", "beta")), **params, **FLAGS["softplus"], state_v_first=True)
torch.cuda.synchronize()
