"""The table an A/B round prints last: for each row of times.py, the base tree's kda_prepare µs and each
other tree's kda_prepare and span as ratios to the base's (means over its runs). Reads OUT/WHO_N.txt,
times.py's output of tree WHO in run N (`base` is the base). Usage: python ratios.py OUT"""
import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(out.glob("*_[0-9].txt")):
    who = f.stem.rsplit("_", 1)[0]
    for line in f.read_text().splitlines():
        m = re.match(r"(.+?): prepare ([\d.]+) us, span ([\d.]+) us", line)
        if m:
            rows.setdefault(m[1], {}).setdefault(who, []).append((float(m[2]), float(m[3])))
if not rows:
    sys.exit(f"no times.py rows under {out}")


def mean(xs):
    return sum(xs) / len(xs)


others = sorted({w for d in rows.values() for w in d} - {"base"})
print(f"{'row':30s} {'base prepare':>15s}  " + "  ".join(f"{w + ' prep/span':>20s}" for w in others))
for r, d in rows.items():
    b = d["base"]
    pb, sb = mean([p for p, _ in b]), mean([s for _, s in b])
    cells = [f"{mean([p for p, _ in d[w]]) / pb:9.3f} {mean([s for _, s in d[w]]) / sb:9.3f}" if w in d else "-"
             for w in others]
    print(f"{r:30s} {min(p for p, _ in b):7.1f}-{max(p for p, _ in b):6.1f}  " + "  ".join(f"{c:>20s}" for c in cells))
