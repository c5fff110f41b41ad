#!/bin/bash
# Which SASS instructions of kda_prepare make its shared-memory bank conflicts (H=96 T=8192, softplus):
# ncu's source view of the second kda_prepare of two chunk_kda calls, then the 25 instructions with the
# most excess shared wavefronts. Run from the repository root on the GPU machine (~60 s):
#   bash docs/studies/kda_prepare_banks/source_view.sh   (writes $OUT/source.csv, prints the table)
set -euo pipefail
OUT=${OUT:-.}
cat > "$OUT/two_calls.py" <<'PY'
import torch
import pykda
from pykda.bench.kda import FLAGS, _inputs
x, params, cu, _ = _inputs(96, [8192], False)
seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
for _ in range(2):
    pykda.chunk_kda(*seq, **params, **FLAGS["softplus"], state_v_first=True)
torch.cuda.synchronize()
PY
PYTHONPATH=. python "$OUT/two_calls.py"   # compile first, outside the profile
PYTHONPATH=. /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:kda_prepare --launch-skip 1 \
  --launch-count 1 --section SourceCounters --page source --print-source sass --csv \
  python "$OUT/two_calls.py" > "$OUT/source.csv"
python - "$OUT/source.csv" <<'PY'
import csv, sys
rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")   # a "Kernel Name" row comes first
head, body = rows[at], [r for r in rows[at + 1:] if len(rows[at]) == len(r)]
col = {h: j for j, h in enumerate(head)}
num = lambda s: 0.0 if s in ("", "-") else float(s.replace(",", ""))
ex, wf, n, src = (col[h] for h in ("L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "Instructions Executed", "Source"))
print(f"shared wavefronts {sum(num(r[wf]) for r in body):,.0f}, excessive {sum(num(r[ex]) for r in body):,.0f}")
print(f"{'index':>5} {'excessive':>12} {'wavefronts':>12} {'executed':>10}  instruction")
for k in sorted(range(len(body)), key=lambda k: -num(body[k][ex]))[:25]:
    r = body[k]
    print(f"{k:5d} {num(r[ex]):>12,.0f} {num(r[wf]):>12,.0f} {num(r[n]):>10,.0f}  {r[src].strip()[:80]}")
PY
