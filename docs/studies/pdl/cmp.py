"""Compare $OUT/head.npz and $OUT/new.npz (exact.py's two runs) array by array, bit for bit."""
import os, numpy as np
a = np.load(os.path.join(os.environ["OUT"], "head.npz")); b = np.load(os.path.join(os.environ["OUT"], "new.npz"))
for k in a.files:
    same = np.array_equal(a[k], b[k], equal_nan=True)
    print(f"{k:8s} {'identical' if same else 'DIFFERENT max %.3e' % np.nanmax(np.abs(a[k] - b[k]))}")
