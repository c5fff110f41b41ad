"""Bound on the fix's one hardware assumption: fp16 subnormal operands.  Emulate the fix with every
fp16 qd/kd/S-operand value below 2^-14 flushed to 0 (as if the mma flushed fp16 denormals)."""
import sys, numpy as np
import kda_emu as E, inputs as I
from pykda.reference import relative_error as rel
from ablate import emu
def fp16_ftz(x):
    y = E.fp16(x)
    return np.where(np.abs(y) < 2.0 ** -14, 0.0, y)
if __name__ == "__main__":
  for name in sys.argv[1:]:
      x = I.INPUTS[name](); o_ref, s_ref = I.reference(name, x, None)
      o, S = emu(x, {**E.DEFAULT, "so": fp16_ftz, "qd": fp16_ftz, "sw": fp16_ftz, "kd": fp16_ftz})
      print(name, "fix with fp16 subnormals flushed: out %.4e state %.4e" % (rel(o, o_ref), rel(S, s_ref)), flush=True)
