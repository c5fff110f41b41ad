# Session 43 on an H100, from the repository root (~3 min): why cuDNN leads the long D 128 decode rows
# by ~4 % on the H100 (not on the H200). (1) ncu: every kernel of the third call of pykda and of cuDNN
# at 32/8 KV 131072 D 128 and pykda at 32/32 KV 262144 D 64 (a row at ~100 % of the copy):
# duration, DRAM rate and bytes, occupancy. (2) `bench decode` over stages 2, 3, 4 and chunk sizes.
# Carry [".kc_new.tar.xz", ".peers.tar.xz"].
[ -d .kc_new ] || tar xJf .kc_new.tar.xz; [ -d .peers/site ] || tar xJf .peers.tar.xz
source .peers/activate.sh; export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_new
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
N="/usr/local/cuda/bin/ncu --clock-control none --cache-control all --metrics $M --csv"
for row in "pykda 32 8 131072 128" "cudnn 32 8 131072 128" "pykda 32 32 262144 64" "cudnn 32 32 262144 64"; do
  set -- $row; python docs/studies/decode_long_h100/ncu_long.py $row > /dev/null 2>&1
  timeout 60 $N python docs/studies/decode_long_h100/ncu_long.py $row 2>/dev/null | grep '^"' > $OUT/ncu_$1_$3.csv
done
timeout 150 python -m pykda bench decode --shapes 32/8:131072,32/32:65536,64/4:500000 --stages 2,3,4 > $OUT/stages.log 2>&1
timeout 100 python -m pykda bench decode --shapes 32/8:131072 --chunk-size 1024,2048,4096,8192,16384 > $OUT/chunks.log 2>&1
python - $OUT <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/ncu_*.csv")):
    rows = list(csv.reader(open(f)))
    if not rows: print(f, "empty"); continue
    c = {h: j for j, h in enumerate(rows[0])}
    print("==", f.split("/")[-1])
    for r in rows[1:]:
        if len(r) == len(rows[0]):
            print(f"  {r[c['ID']]:>3} {r[c['Kernel Name']][:40]:<40} {r[c['Metric Name']][:48]:<48} {r[c['Metric Value']]}")
PY
grep -v "Warn\|warn\|return torch\|bench decode:" $OUT/stages.log | tail -14; grep -v "Warn\|warn\|return torch\|bench decode:" $OUT/chunks.log | tail -9
