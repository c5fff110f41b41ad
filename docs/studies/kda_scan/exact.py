"""chunk_kda o and final state on rows with many scan steps, saved to $OUT/<tag>.npz; `cmp` compares head.npz and new.npz bit for bit."""
import os, sys
import numpy as np, torch, pykda
from pykda.bench.kda import FLAGS, _inputs
tag = sys.argv[1]
if tag == "cmp":
    a, b = np.load(os.environ["OUT"] + "/head.npz"), np.load(os.environ["OUT"] + "/new.npz")
    for k in a.files:
        print(k, "identical" if np.array_equal(a[k], b[k], equal_nan=True) else "DIFFERENT %.3e" % np.nanmax(np.abs(a[k] - b[k])))
    sys.exit()
res = {}
for name, H, lengths in [("h4", 4, [40000]), ("h1", 1, [131072]), ("var", 8, [30000] + [1024] * 7)]:
    x, params, cu, h0 = _inputs(H, lengths, True)
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    kw = dict(cu_seqlens=cu, cu_seqlens_cpu=cu.cpu()) if cu is not None else {}
    o, s = pykda.chunk_kda(*seq, **params, **FLAGS["softplus"], initial_state=h0, output_final_state=True,
                           state_v_first=True, **kw)
    torch.cuda.synchronize()
    res[name + "_o"] = o.float().cpu().numpy(); res[name + "_s"] = s.float().cpu().numpy()
np.savez(os.environ["OUT"] + f"/{tag}.npz", **res)
