"""Join ncu's per-instruction source counters of one kernel with the cubin's line table, and print
where its instructions, shared-memory wavefronts and warp stalls come from, by line of the rendered
source (inlined helpers attributed to the kernel line that calls them, and to their own line).

    python lines.py source.csv kernel.sass kernel.cu
(source.csv: ncu --page source --print-source sass --csv; kernel.sass: nvdisasm -c -gi kernel.cubin)"""
import csv
import re
import sys
from collections import defaultdict

csv_path, sass_path, cu_path = sys.argv[1:4]
rows = list(csv.reader(line for line in open(csv_path) if line.startswith('"')))
at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
head, body = rows[at], [r for r in rows[at + 1:] if len(r) == len(rows[at])]
col = {h: j for j, h in enumerate(head)}
num = lambda s: 0.0 if s in ("", "-") else float(s.replace(",", ""))   # noqa: E731
want = {"exec": "Instructions Executed", "wf": "L1 Wavefronts Shared", "ex": "L1 Wavefronts Shared Excessive",
        "stall": "Warp Stall Sampling (All Samples)"}
have = {k: col[v] for k, v in want.items() if v in col}
print("ncu columns used:", {k: want[k] for k in have}, "| missing:", [v for k, v in want.items() if k not in have])

# nvdisasm -gi: "//## File "kernel.cu", line 300 inlined at "kernel.cu", line 412 ..." before instructions
where, inner, outer = {}, None, None
for line in open(sass_path):
    m = re.search(r'//## File "[^"]*", line (\d+)(.*)', line)
    if m:
        inner = int(m.group(1))
        chain = re.findall(r'inlined at "[^"]*", line (\d+)', m.group(2))
        outer = int(chain[-1]) if chain else inner
        continue
    a = re.search(r"/\*([0-9a-f]{4,})\*/\s+\S", line)
    if a:
        where[int(a.group(1), 16)] = (inner, outer)
offsets = sorted(where)
addr = [int(r[col["Address"]], 16) for r in body]
base = min(addr)
src = open(cu_path).read().split("\n")
tot = {k: sum(num(r[j]) for r in body) for k, j in have.items()}
print("totals:", {k: f"{v:,.0f}" for k, v in tot.items()}, f"| {len(body)} instructions, {len(where)} in the line table")

for key, name in (("outer", "kernel line (inlined calls at their call site)"), ("inner", "innermost line")):
    acc = defaultdict(lambda: defaultdict(float))
    for r, a in zip(body, addr):
        inner_l, outer_l = where.get(a - base, (None, None))
        ln = outer_l if key == "outer" else inner_l
        for k, j in have.items():
            acc[ln][k] += num(r[j])
    for sort_key in [k for k in ("wf", "stall", "exec") if k in have]:
        print(f"\n== by {name}, top 25 by {want[sort_key]}")
        print(f"{'line':>5} " + " ".join(f"{k:>10}" for k in have) + "  source")
        for ln in sorted(acc, key=lambda l: -acc[l][sort_key])[:25]:
            text = src[ln - 1].strip()[:90] if ln else "?"
            print(f"{ln if ln else 0:5d} " + " ".join(f"{100 * acc[ln][k] / max(tot[k], 1):9.1f}%" for k in have) + f"  {text}")
