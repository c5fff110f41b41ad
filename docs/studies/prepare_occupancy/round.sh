#!/bin/bash
# This tree's kda_prepare (seven_ctas.patch's layout at six CTAs an SM, landed in session 62) against the
# kernel before it (.po_main: 2f623aa): the KDA GPU tests, kda_prepare µs and the call's span at issue 12's
# rows (prepare_frags/times.py, the two alternated three times), the outputs compared, memcheck and
# racecheck of the KDA cases, a table of the ratios last. Carry .kc_po.tar.xz (both trees' kda kernels)
# and .po.tar.xz (.po_main), built as README.md says.
set -o pipefail
export PYTHONUNBUFFERED=1
tar xJf .kc_po.tar.xz && tar xJf .po.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/.kc_po
nvidia-smi --query-gpu=name --format=csv,noheader
T=docs/studies/prepare_frags/times.py
PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_kda_gpu.py \
  tests/test_kda_segments_gpu.py 2>&1 | tail -1 | tee $OUT/tests.txt
mkdir -p $OUT/o_main $OUT/o_tree
for round in 1 2 3; do
  save_m=""; save_t=""; [ $round = 1 ] && save_m="--save $OUT/o_main" && save_t="--save $OUT/o_tree"
  (cd .po_main && PYTHONPATH=. timeout 60 python $OLDPWD/$T $save_m) > $OUT/main_$round.txt 2>&1
  PYTHONPATH=. timeout 60 python $T $save_t > $OUT/tree_$round.txt 2>&1
done
echo "times at ${SECONDS}s"
PYTHONPATH=. python docs/studies/prepare_frags/compare.py $OUT/o_tree $OUT/o_main > $OUT/compare.txt 2>&1
rm -rf $OUT/o_main $OUT/o_tree
PYTHONPATH=. timeout 200 python -m pykda sanitize --tool memcheck,racecheck --shards 4 --timeout 90 \
  --log-dir $OUT/san --pytest-args="-k 'kda and not decode'" 2>&1 | tail -3
python - $OUT <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1]); rows = {}
for f in sorted(out.glob("*_[123].txt")):
    who = f.stem.split("_")[0]
    for line in f.read_text().splitlines():
        m = re.match(r"(.+?): prepare ([\d.]+) us, span ([\d.]+) us", line)
        if m: rows.setdefault(m[1], {}).setdefault(who, []).append((float(m[2]), float(m[3])))
print(f"{'row':32s} {'prep main':>18s} {'prep tree':>18s} {'ratio':>6s} {'span ratio':>10s}")
for r, d in rows.items():
    pm = [p for p, _ in d["main"]]; pt = [p for p, _ in d["tree"]]
    sm = [s for _, s in d["main"]]; st = [s for _, s in d["tree"]]
    print(f"{r:32s} {min(pm):8.1f}-{max(pm):7.1f}  {min(pt):8.1f}-{max(pt):7.1f}  {sum(pt)/sum(pm):6.3f} {sum(st)/sum(sm):10.3f}")
PY
grep -c "0.00e+00" $OUT/compare.txt; grep -v "0.00e+00" $OUT/compare.txt | head -5
echo "done at ${SECONDS}s"
