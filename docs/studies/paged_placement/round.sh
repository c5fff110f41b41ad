#!/bin/bash
# Device round: placement.py (all rows), then ncu of one_row.py's padded and paged kernels.
# Run from the repository root with the decode kernel cache in $PYKDA_CACHE_DIR.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
python docs/studies/paged_placement/placement.py 2>&1 | tee $OUT/placement.txt
NCU=/usr/local/cuda/bin/ncu
for what in padded 16 64 1; do
  $NCU --kernel-name regex:decode_partial --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --section Occupancy \
    python docs/studies/paged_placement/one_row.py $what > $OUT/ncu_$what.txt 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Issued Warp|No Eligible|Stall|Registers|Block Size|Grid Size|Dynamic Shared" $OUT/ncu_$what.txt | head -30 | sed "s/^/[$what] /"
done
