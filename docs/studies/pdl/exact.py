"""chunk_kda's o and final state at a few shapes (softplus unbounded, safe, varlen, K 128 long, steep decays), saved
to $OUT/<tag>.npz: two trees' files compared bit for bit."""
import os, sys
import numpy as np
import torch
import pykda
from pykda.bench.kda import FLAGS, _inputs
tag = sys.argv[1]
res = {}
for name, H, lengths, gate in [("h96", 96, [1024], "softplus"), ("safe", 16, [777, 1, 0, 300], "safe"),
                                ("var", 8, [17, 4096, 15, 1], "softplus"), ("long", 4, [40000], "softplus"),
                                ("steep", 8, [1000, 33], "softplus")]:
    x, params, cu, h0 = _inputs(H, lengths, True)
    if name == "steep":   # decays past 2^-120 in a chunk: the growth-free form
        x["g"] = (x["g"].float() * 4 + 8).to(torch.bfloat16)
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    kw = dict(cu_seqlens=cu) if cu is not None else {}
    o, s = pykda.chunk_kda(*seq, **params, **FLAGS[gate], initial_state=h0, output_final_state=True, **kw)
    torch.cuda.synchronize()
    res[name + "_o"] = o.float().cpu().numpy(); res[name + "_s"] = s.float().cpu().numpy()
np.savez(os.path.join(os.environ["OUT"], tag + ".npz"), **res)
print(tag, {k: float(np.abs(v).sum()) for k, v in res.items()})
