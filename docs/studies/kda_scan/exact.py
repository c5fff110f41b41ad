"""chunk_kda o and final state on rows with many scan steps: `exact.py TAG` saves them to $OUT/TAG.npz;
`exact.py cmp A B` compares A.npz and B.npz (identical, or the largest difference relative to the
array's largest magnitude)."""
import os, sys
import numpy as np, torch, pykda
from pykda.bench.kda import FLAGS, _inputs
tag = sys.argv[1]
if tag == "cmp":
    a, b = (np.load(os.environ["OUT"] + f"/{t}.npz") for t in sys.argv[2:4])
    for k in a.files:
        same = np.array_equal(a[k], b[k], equal_nan=True)
        print(sys.argv[2], sys.argv[3], k, "identical" if same else
              "differ by %.3e of max |x|" % (np.nanmax(np.abs(a[k] - b[k])) / np.nanmax(np.abs(a[k]))))
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
