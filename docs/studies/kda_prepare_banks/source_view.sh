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
import csv, re, sys
rows = list(csv.reader(line for line in open(sys.argv[1]) if line.startswith('"')))
head, body = rows[0], rows[1:]
want = [i for i, h in enumerate(head) if re.search(r"shared.*excessive|excessive.*shared", h, re.I)]
src = next(i for i, h in enumerate(head) if re.search(r"^source$", h, re.I))
print("columns:", [head[i] for i in want])
num = lambda s: float(s.replace(",", "") or 0)
body.sort(key=lambda r: -num(r[want[0]]))
total = sum(num(r[want[0]]) for r in body)
print(f"total {total:,.0f}")
for r in body[:25]:
    print(f"{num(r[want[0]]):>14,.0f}  {r[src][:90]}")
PY
