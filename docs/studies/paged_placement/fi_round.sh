#!/bin/bash
# Device round (repository root, the decode kernel cache in $PYKDA_CACHE_DIR, .peers carried): fi_row.py's
# event times, then ncu of its four calls (pykda padded and paged, FlashInfer's two paths) on one launch each.
set -o pipefail
source .peers/activate.sh
export PYTHONPATH=.:$PYTHONPATH PYTHONUNBUFFERED=1
python docs/studies/paged_placement/fi_row.py ${1:-64} 2>&1 | grep -v Warning | tee $OUT/fi_row.txt
/usr/local/cuda/bin/ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section LaunchStats --section Occupancy python docs/studies/paged_placement/fi_row.py ${1:-64} > $OUT/ncu_fi_row.txt 2>&1
grep -E "^  [A-Za-z_].*\(|Duration|DRAM Throughput|Mem Busy|L2 Hit Rate|L1/TEX Hit|Grid Size|Block Size|Registers Per|Achieved Occupancy|Dynamic Shared" \
  $OUT/ncu_fi_row.txt | cut -c1-150
