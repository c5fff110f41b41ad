#!/bin/bash
# The owed H200 round of session 59 (repository root; carry .peers, .kc_tree.tar.xz (this tree's decode kernels)
# and .ab_main.tar.xz (main at ca536e2, before the merge changes, its kernels in .kc_main)). Build them here first:
#   PYKDA_CACHE_DIR=$PWD/.kc_tree python -m pykda compile --family decode --jobs 12 && tar cJf .kc_tree.tar.xz .kc_tree
#   (git archive ca536e2 pykda templates src pyproject.toml into .ab_main/, its decode kernels into .ab_main/.kc_main,
#    tar cJf .ab_main.tar.xz .ab_main)
# The read floor, the merge A/B (one alternation), then both grids cut at --max-seconds; summaries last.
# It is for an H200: on any other card it stops at once (ANY_GPU=1 runs it anyway).
set -o pipefail
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H200*) ;; *) [ "${ANY_GPU:-0}" = 1 ] || { echo "h200_round: $gpu is not an H200; stopped"; exit 0; } ;; esac
[ -d .kc_tree ] || tar xJf .kc_tree.tar.xz || exit 1
[ -d .ab_main ] || tar xJf .ab_main.tar.xz || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PYKDA_CACHE_DIR=$PWD/.kc_tree PYTHONPATH=. python docs/studies/read_floor/read_floor.py > $OUT/read_floor.txt 2>&1
(cd .ab_main && PYKDA_CACHE_DIR=$PWD/.kc_main PYTHONPATH=. python ../docs/studies/merge_online/ab.py $OUT/main_1) > $OUT/main_1.log 2>&1
PYKDA_CACHE_DIR=$PWD/.kc_tree PYTHONPATH=. python docs/studies/merge_online/ab.py $OUT/tree_1 > $OUT/tree_1.log 2>&1
PYTHONPATH=. python docs/studies/merge_online/ab.py --table $OUT/main_1 $OUT/tree_1 > $OUT/ab_table.txt 2>&1
echo "read floor and A/B done at ${SECONDS}s"
source .peers/activate.sh
export PYKDA_CACHE_DIR=$PWD/.kc_tree PYTHONPATH=.:$PYTHONPATH
python -m pykda bench paged-decode --grid --max-seconds ${1:-120} > $OUT/paged_grid.txt 2>&1
python -m pykda bench decode --grid --max-seconds ${2:-150} > $OUT/decode_grid.txt 2>&1
tail -9 $OUT/read_floor.txt
tail -4 $OUT/ab_table.txt
grep -E "^paged grid|stopped after" $OUT/paged_grid.txt
grep -E "^grid|stopped after" $OUT/decode_grid.txt | tail -3
