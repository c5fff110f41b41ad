# Session 43 wrote this for the next device session, from the repository root on branch
# wip/paged_indptr. Carry [".kc_pi.tar.xz", ".kc_s43.tar.xz", ".base_main.tar.xz", ".peers.tar.xz",
# ".fi_ws.tar.xz"]: the branch's decode kernels (`PYKDA_CACHE_DIR=.kc_pi python -m pykda compile
# --family decode`, packed `tar cf - .kc_pi | xz > .kc_pi.tar.xz`), main's (.kc_s43), main's tree
# (`mkdir .base_main; git archive main pykda templates src | tar x -C .base_main`, packed likewise).
for c in .kc_pi .kc_s43 .base_main; do [ -d $c ] || tar xJf $c.tar.xz; done
[ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; [ -d /tmp/fi-peer-ws/.cache ] || tar xJf .fi_ws.tar.xz -C /tmp
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
BR="env PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_pi"
MAIN="env PYTHONPATH=.base_main:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_s43"
timeout 60 $BR python -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_decode_gpu.py > $OUT/gpu_tests.log 2>&1
timeout 200 $BR python -m pykda sanitize --tool memcheck,racecheck --shards 8 --timeout 90 \
  --pytest-args "-k 'paged'" --log-dir /tmp/sanitize > $OUT/sanitize.log 2>&1
for r in 1 2; do
  timeout 60 $MAIN python -m pykda bench paged-decode --grid --max-seconds 50 > $OUT/main_$r.log 2>&1
  timeout 60 $BR python -m pykda bench paged-decode --grid --max-seconds 50 > $OUT/branch_$r.log 2>&1
done
grep -E "passed|failed" $OUT/gpu_tests.log | tail -1; grep -E "PASS|FAIL" $OUT/sanitize.log | cut -c1-200
for f in $OUT/main_* $OUT/branch_*; do echo "== $f"; grep -E "^paged grid" $f | cut -c1-160; done
python - $OUT <<'PY'
import re, sys
def rows(f):   # shape -> (pages of 16 µs, pages of 1 µs)
    out = {}
    for line in open(f):
        if re.match(r"^\s+\d+x\d+/\d+:", line):
            t = line.split()
            out[t[0] + " " + t[1]] = (float(t[4]), float(t[11]))
    return out
d = sys.argv[1]
runs = {w: [rows(f"{d}/{w}_{r}.log") for r in (1, 2)] for w in ("main", "branch")}
print(f"{'shape':26} {'p16 main':>9} {'branch':>7} {'p1 main':>8} {'branch':>7}")
for k in runs["main"][0]:
    m = [min(x[k][i] for x in runs["main"]) for i in (0, 1)]
    b = [min(x[k][i] for x in runs["branch"]) for i in (0, 1)]
    print(f"{k:26} {m[0]:9.1f} {b[0]:7.1f} {m[1]:8.1f} {b[1]:7.1f}")
PY
