"""Candidate fixes, each as a kernel could do it, on every input (out and final-state rel-L2 vs float64)."""
import sys, json, numpy as np
import kda_emu as E, inputs as I
from pykda.reference import relative_error as rel
from ablate import emu

D = E.DEFAULT
FIXES = {
    "kernel (as is)": {},
    "SPLIT_S (S hi+lo bf16, W and O)": dict(sw="bf16x2", so="bf16x2"),
    "S hi+lo for O only": dict(so="bf16x2"),
    "qd hi+lo only (S bf16)": dict(qd="bf16x2"),
    "O product fp16 (S->fp16 for O, qd fp16)": dict(so="fp16", qd="fp16"),
    "O+W fp16 (S->fp16, qd, kd fp16)": dict(so="fp16", qd="fp16", sw="fp16", kd="fp16"),
    "O product tf32 (S tf32, qd fp32 record)": dict(so="tf32", qd="tf32"),
    "O+W fp16, output not rounded": dict(so="fp16", qd="fp16", sw="fp16", kd="fp16", out=None),
    "O+W fp16 + Ab, Mqk, kr, X, U exact": dict(so="fp16", qd="fp16", sw="fp16", kd="fp16", ab=None, mqk=None, kr=None, x=None, u=None),
}

if __name__ == "__main__":
    out, names = sys.argv[1], sys.argv[2:]
    seg = 0
    if names and names[0].startswith("seg="):
        seg = int(names.pop(0)[4:])
    res = {}
    for name in names:
        nm, _, seed = name.partition(":")
        x = I.INPUTS[nm]() if not seed else I.INPUTS[nm](int(seed))
        o_ref, s_ref = I.reference(nm, x, int(seed) if seed else None)
        res[name] = {"ref_bf16": rel(E.bf16(o_ref), o_ref)}
        for fix, ch in FIXES.items():
            if seed and fix not in ("kernel (as is)", "O+W fp16 (S->fp16, qd, kd fp16)", "O product fp16 (S->fp16 for O, qd fp16)"):
                continue
            o, S = emu(x, {**D, **ch}) if not seg else E.chunk_kda_emu(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["S0"], x["gate"], x["lower_bound"] if x["lower_bound"] is not None else -5.0, cfg={**D, **ch}, segment_chunks=seg)
            res[name][fix] = (rel(o, o_ref), rel(S, s_ref))
            print(name, fix, "%.4e %.4e" % res[name][fix], flush=True)
        json.dump(res, open(out, "w"), indent=1)
