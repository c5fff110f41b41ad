import sys, time, numpy as np
import kda_emu as E, inputs as I
from pykda.reference import relative_error as rel

def run(name, seed=None, cfg=None, seg=0, H=None):
    x = I.INPUTS[name]() if seed is None else I.INPUTS[name](seed)
    o_ref, s_ref = I.reference(name, x, seed)
    t = time.time()
    o, S = E.chunk_kda_emu(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["S0"], x["gate"],
                           x["lower_bound"] if x["lower_bound"] is not None else -5.0, cfg=cfg, segment_chunks=seg)
    return rel(o, o_ref), rel(S, s_ref), time.time() - t

if __name__ == "__main__":
    for name in sys.argv[1:]:
        t = time.time(); x = I.INPUTS[name](); I.reference(name, x, None); print("ref", time.time() - t, flush=True)
        print(name, "exact serial", run(name, cfg=E.EXACT), flush=True)
        print(name, "exact seg64", run(name, cfg=E.EXACT, seg=64), flush=True)
        print(name, "default serial", run(name), flush=True)
        print(name, "default seg64", run(name, seg=64), flush=True)
        print("H200", I.H200[name])
