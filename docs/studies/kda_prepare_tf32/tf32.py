"""kda_prepare's L and Mqk products in tf32 against the bf16 hi + lo split (session 27; not landed: README).

Every hook as the kernels round (qd, kd, sw, so in fp16: main since session 12), the products either
split in bf16 hi + lo (hi*hi + hi*lo + lo*hi, fp32 accumulate per k16 step: `kda_emu.split_dot`), or
one tf32 mma per k8 step with both operands rounded to tf32 (half an ulp added to the bits, the tensor
core truncating the rest: what `tf32_round` does), or truncated without that rounding.
Run from this folder with the repository root on PYTHONPATH: `python tf32.py bench_sp stress3 ...`
(the names of ../kda_rounding/inputs.py; ~40 s each, the float64 references cached there).
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kda_rounding"))
import inputs as I  # noqa: E402
import kda_emu as E  # noqa: E402
from pykda.reference import relative_error as rel  # noqa: E402

MAIN = {**E.DEFAULT, "qd": "fp16", "kd": "fp16", "sw": "fp16", "so": "fp16"}
SPLIT = E.split_dot


def truncated(x):
    bits = np.asarray(x, np.float64).astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32).astype(np.float64)


def tf32_dot(rnd):
    """sum_d A[..., i, d] B[..., j, d] on tf32 mma steps of k = 8, operands through rnd, fp32 accumulate."""
    def dot(A, B, fp32, acc32):
        if not fp32:
            return SPLIT(A, B, fp32, acc32)
        A, B = rnd(E.f32(A)), rnd(E.f32(B))
        acc = np.zeros(A.shape[:-1] + (B.shape[-2],))
        for k0 in range(0, A.shape[-1], 8):
            s = slice(k0, k0 + 8)
            acc = E.f32(acc + np.einsum("...id,...jd->...ij", A[..., s], B[..., s]))
        return acc
    return dot


FORMS = {"bf16 hi + lo": SPLIT, "tf32 rounded": tf32_dot(E.tf32), "tf32 truncated": tf32_dot(truncated)}

for name in sys.argv[1:]:
    x = I.INPUTS[name]()
    o_ref, s_ref = I.reference(name, x, None)
    for form, dot in FORMS.items():
        E.split_dot = dot
        o, S = E.chunk_kda_emu(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["S0"], x["gate"],
                               x["lower_bound"] if x["lower_bound"] is not None else -5.0, cfg=MAIN)
        print(f"{name:10s} {form:15s} out {rel(o, o_ref):.4e}  state {rel(S, s_ref):.4e}", flush=True)
E.split_dot = SPLIT
