#!/bin/bash
# The grid's worst row (32/8 heads, one sequence of 17 KV rows, D 64): pykda's kernel (decode_tiny since session 47) beside
# FlashInfer's single-decode kernel under ncu, one launch of each after warm-up, cold L2 (ncu's
# cache flush), clocks unlocked. Prints every metric of the listed sections side by side, then each
# kernel's 15 SASS instructions with the most stall samples (where its warps wait, and on what).
# Run from the repository root on the GPU machine, peers staged (~2 min):
#   source .peers/activate.sh; bash docs/studies/decode_timeline/ncu_compare.sh   (CSVs under $OUT)
set -euo pipefail
OUT=${OUT:-.}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
cat > "$OUT/s17.py" <<'PY'
import sys
import torch
import pykda
hq, hkv, S, D = 32, 8, 17, 64
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(hq, D, device="cuda", generator=g).to(torch.bfloat16)
k = torch.randn(hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)   # HND, as the grid's peers read it
v = torch.randn(hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)
which = sys.argv[1]
if which == "pykda":
    call = lambda: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND")  # noqa: E731
else:
    import flashinfer
    call = lambda: flashinfer.single_decode_with_kv_cache(q, k, v, kv_layout="HND")  # noqa: E731
for _ in range(3):   # the profiled launch is the third (both JIT/compile on the first)
    call()
torch.cuda.synchronize()
PY
NCU="/usr/local/cuda/bin/ncu --clock-control none --cache-control all --launch-skip 2 --launch-count 1"
SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats"
declare -A KERNEL=([pykda]="regex:decode_(partial|tiny)" [flashinfer]="regex:SingleDecode")
for who in pykda flashinfer; do
  python "$OUT/s17.py" "$who"   # compile (and FlashInfer's JIT) outside the profile
  $NCU --kernel-name "${KERNEL[$who]}" $SECTIONS --csv python "$OUT/s17.py" "$who" > "$OUT/$who.details.csv"
  $NCU --kernel-name "${KERNEL[$who]}" --section SourceCounters --section WarpStateStats --page source \
    --print-source sass --csv python "$OUT/s17.py" "$who" > "$OUT/$who.source.csv"
done
python - "$OUT" <<'PY'
import csv, sys
out = sys.argv[1]
num = lambda s: 0.0 if s in ("", "-", "n/a") else float(s.replace(",", ""))  # noqa: E731


def quoted_rows(path):
    return list(csv.reader(line for line in open(path) if line.startswith('"')))


def details(path):
    rows = quoted_rows(path)
    col = {h: j for j, h in enumerate(rows[0])}
    return {(r[col["Section Name"]], r[col["Metric Name"]], r[col["Metric Unit"]]): r[col["Metric Value"]]
            for r in rows[1:] if len(r) == len(rows[0])}


mine, theirs = details(f"{out}/pykda.details.csv"), details(f"{out}/flashinfer.details.csv")
print(f"{'section':<18} {'metric':<52} {'unit':<10} {'pykda':>14} {'FlashInfer':>14}")
for key in sorted(set(mine) | set(theirs)):
    print(f"{key[0][:18]:<18} {key[1][:52]:<52} {key[2][:10]:<10} {mine.get(key, '')[:14]:>14} "
          f"{theirs.get(key, '')[:14]:>14}")

for who in ("pykda", "flashinfer"):
    rows = quoted_rows(f"{out}/{who}.source.csv")
    at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")   # a "Kernel Name" row comes first
    head, body = rows[at], [r for r in rows[at + 1:] if len(r) == len(rows[at])]
    col = {h: j for j, h in enumerate(head)}
    samples = next(h for h in head if h.startswith("Warp Stall Sampling (All"))
    reasons = [h for h in head if h.startswith("stall_")] or []   # per-reason columns, where ncu gives them
    total = sum(num(r[col[samples]]) for r in body)
    print(f"\n{who}: {len(body)} SASS instructions, {total:,.0f} stall samples; the 15 with the most")
    for r in sorted(body, key=lambda r: -num(r[col[samples]]))[:15]:
        top = sorted(((num(r[col[h]]), h[6:]) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{name} {n:.0f}" for n, name in top if n)
        print(f"{num(r[col[samples]]):8.0f} {100 * num(r[col[samples]]) / max(total, 1):5.1f} %  "
              f"{r[col['Source']].strip()[:70]:<70} {why}")
PY
