# Session 44 wrote this for the next device session, from the repository root on branch
# wip/kd_folded (~4 min): chunk_kda on issue 12's rows, main's tree and the branch's alternated
# twice in fresh processes, then each tree's accuracy against float64 and the two trees' outputs
# against each other. Carry [".kc_kf.tar.xz", ".kc_km.tar.xz", ".base_main.tar.xz"]: the branch's and
# main's kda kernels (check_round.sh says how; main's from `.base_main`, its pykda, templates and src
# by `git archive main`).
for c in .kc_kf .kc_km .base_main; do [ -d $c ] || tar xJf $c.tar.xz; done
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
AB=docs/studies/kda_one_product/ab.py
BR="env PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_kf"
MAIN="env PYTHONPATH=.base_main:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_km"
for r in 1 2; do
  a=""; [ $r = 2 ] && a=--accuracy
  timeout 100 $MAIN python $AB main $OUT $a > $OUT/main_$r.log 2>&1
  timeout 100 $BR python $AB branch $OUT $a > $OUT/branch_$r.log 2>&1
done
grep -h "accuracy\|Error\|error" $OUT/main_2.log $OUT/branch_2.log | head
python - $OUT <<'PY'
import re, sys, torch
d = sys.argv[1]
for g in ("softplus", "safe"):
    m, b = torch.load(f"{d}/main_{g}.pt"), torch.load(f"{d}/branch_{g}.pt")
    print(g, " ".join(f"{k} rel diff {((m[k] - b[k]).norm() / m[k].norm()).item():.2e}" for k in m))
rows = {}
for w in ("main", "branch"):
    for r in (1, 2):
        for line in open(f"{d}/{w}_{r}.log"):
            if line.endswith(" ms\n"):
                key = " ".join(line.split()[1:6])
                rows.setdefault(key, {}).setdefault(w, []).append(float(line.split()[-2]))
print(f"{'row':56} {'main ms':>8} {'branch':>8} {'ratio':>6}")
for key, t in rows.items():
    if len(t) == 2:
        m, b = min(t["main"]), min(t["branch"])
        print(f"{key:56} {m:8.3f} {b:8.3f} {b / m:6.3f}")
PY
