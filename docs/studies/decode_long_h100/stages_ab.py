"""`python -m pykda bench ...` with decode's stages for one head dim set in this process, at every
number of units: `python stages_ab.py D STAGES bench decode --grid ...` (STAGES 0: the tree's own)."""
import sys

import pykda.ops.decode as decode
from pykda.__main__ import main

d, stages = int(sys.argv[1]), int(sys.argv[2])
if stages:
    decode.DEFAULT_STAGES[d] = stages
    getattr(decode, "FEW_UNITS_STAGES", {}).pop(d, None)
print(f"DEFAULT_STAGES {decode.DEFAULT_STAGES}", flush=True)
sys.exit(main(sys.argv[3:]))
