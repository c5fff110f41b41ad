#!/bin/bash
# Session 67: the pipelined kda_prepare on an H200 (its H100 rounds are in the README), beside the owed
# H200 sweeps of decode_partial's stages and the long rows' segments. Run from the repository root with
# the patch applied, carrying .kc_pp.tar.xz (main's kda and decode kernels and both patched trees' kda
# kernels) and .pp.tar.xz (.pp_base: main; .pp_4: the patch at four CTAs an SM). On any other GPU it
# stops at once: the H100's answers are in the README. ROUNDS (default 2) alternations; SEGMENTS=0 skips
# the segment sweep. The last table names the trees as times.py ran them: tree (the patch, five CTAs an
# SM) and four (.pp_4), each as ratios to base (main).
set -o pipefail
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
case "$gpu" in *H200*) ;; *) echo "not an H200: stopped"; exit 0;; esac
tar xJf .kc_pp.tar.xz && tar xJf .pp.tar.xz || exit 1
export PYKDA_CACHE_DIR=$PWD/.kc_pp
T=docs/studies/prepare_frags/times.py
mkdir -p $OUT/o_base $OUT/o_tree
for round in $(seq 1 ${ROUNDS:-2}); do
  save_b=""; save_t=""; [ $round = 1 ] && save_b="--save $OUT/o_base" && save_t="--save $OUT/o_tree"
  (cd .pp_base && PYTHONPATH=. timeout 60 python $OLDPWD/$T $save_b) > $OUT/base_$round.txt 2>&1
  PYTHONPATH=. timeout 60 python $T $save_t > $OUT/tree_$round.txt 2>&1
  (cd .pp_4 && PYTHONPATH=. timeout 60 python $OLDPWD/$T) > $OUT/four_$round.txt 2>&1
done
echo "times at ${SECONDS}s"
PYTHONPATH=. python docs/studies/prepare_frags/compare.py $OUT/o_tree $OUT/o_base > $OUT/compare.txt 2>&1
rm -rf $OUT/o_base $OUT/o_tree
echo "outputs equal to main's: $(grep -c '0.00e+00' $OUT/compare.txt) of 10"
cd .pp_base
PYTHONPATH=. timeout 100 python -m pykda bench decode --stages 4,5,6 \
  --shapes 32/32:8192,16/16:8192,32/8:131072,128/8:65536,64/8:50000,8/1:1048576 > $OUT/decode_stages.txt 2>&1
echo "decode at ${SECONDS}s"
[ "${SEGMENTS:-1}" = 1 ] && PYTHONPATH=. timeout 100 python -m pykda bench kda --shapes 8:131072 \
  --segment-chunks 256,512,1024 --warps 4,8 > $OUT/kda_segments.txt 2>&1
echo "segments at ${SECONDS}s"
cd ..
python docs/studies/prepare_frags/ratios.py $OUT
grep -v "%|" $OUT/decode_stages.txt | tail -22
[ -f $OUT/kda_segments.txt ] && grep -v "%|" $OUT/kda_segments.txt | tail -16
echo "done at ${SECONDS}s"
