# Session 46, from the repository root (~2 min, any card): issue 12's rows with the kda kernels of
# NVRTC 13.0 (.kc_130, as `python -m pykda compile --family kda` builds them with the cuda13 extra)
# and of NVRTC 13.5 (.kc_135, compiled by 13.5 and stored under 13.0's cache names by mk135.py, so
# that the device's NVRTC 13.0 loads them), alternated twice in fresh processes.
# Carry [".kc_130.tar.xz", ".kc_135.tar.xz"].
for c in .kc_130 .kc_135; do [ -d $c ] || tar xJf $c.tar.xz; done
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
for r in 1 2; do for v in 130 135; do
  PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_$v timeout 100 python docs/studies/nvrtc_versions/time_rows.py $v \
    > $OUT/${v}_$r.log 2>&1
done; done
python - $OUT <<'PY'
import sys
rows = {}
for v in ("130", "135"):
    for r in (1, 2):
        for line in open(f"{sys.argv[1]}/{v}_{r}.log"):
            if line.endswith(" ms\n"):
                rows.setdefault(" ".join(line.split()[1:5]), {}).setdefault(v, []).append(float(line.split()[-2]))
print(f"{'row':34} {'13.0 ms':>8} {'13.5 ms':>8} {'ratio':>6}")
for key, t in rows.items():
    if len(t) == 2:
        print(f"{key:34} {min(t['130']):8.3f} {min(t['135']):8.3f} {min(t['135']) / min(t['130']):6.3f}")
PY
