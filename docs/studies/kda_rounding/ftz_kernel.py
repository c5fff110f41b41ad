import sys, numpy as np
import kda_emu as E, inputs as I
from pykda.reference import relative_error as rel
from ablate import emu
from ftz_check import fp16_ftz
for name in sys.argv[1:]:
    x = I.INPUTS[name](); o_ref, s_ref = I.reference(name, x, None)
    o, S = emu(x, {**E.DEFAULT, **{h: fp16_ftz for h in ("kr", "ab", "mqk", "x", "u")}})
    print(name, "kernel as is, fp16 operands flushed below 2^-14: out %.4e state %.4e (H200 %s)" % (rel(o, o_ref), rel(S, s_ref), I.H200[name]), flush=True)
