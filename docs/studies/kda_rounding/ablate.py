"""Ablation: every hook off alone (rest as the kernel) and on alone (rest float64), per input."""
import sys, json, time, numpy as np
import kda_emu as E, inputs as I
from pykda.reference import relative_error as rel

def emu(x, cfg, seg=0, stats=None):
    return E.chunk_kda_emu(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["S0"], x["gate"],
                           x["lower_bound"] if x["lower_bound"] is not None else -5.0, cfg=cfg, segment_chunks=seg,
                           stats=stats)

def main(names, out):
    res = {}
    for name in names:
        x = I.INPUTS[name]()
        o_ref, s_ref = I.reference(name, x, None)
        r = res[name] = {}
        def ev(tag, cfg, stats=None):
            o, S = emu(x, cfg, stats=stats)
            r[tag] = (rel(o, o_ref), rel(S, s_ref))
            print(name, tag, "%.4e %.4e" % r[tag], flush=True)
        st = {}
        ev("all", E.DEFAULT, st)
        r["stats"] = st
        ev("none", E.EXACT)
        for h in E.HOOKS:
            ev("off:" + h, {**E.DEFAULT, h: None})
            ev("on:" + h, {**E.EXACT, h: E.DEFAULT[h]})
        # bf16 rounding of the exact output
        r["ref_bf16"] = (rel(E.bf16(o_ref), o_ref), 0.0)
        json.dump(res, open(out, "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[2:], sys.argv[1])
