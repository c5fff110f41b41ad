"""Max |a − b| / max |b| of the outputs two trees saved with times.py --save: compare.py DIR_A DIR_B."""
import pathlib
import sys

import torch

for pa in sorted(pathlib.Path(sys.argv[1]).glob("*.pt")):
    a, b = torch.load(pa).float(), torch.load(pathlib.Path(sys.argv[2]) / pa.name).float()
    print(f"{pa.stem}: {((a - b).abs().max() / b.abs().max()).item():.2e}")
