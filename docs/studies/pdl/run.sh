#!/bin/bash
# session 23 round 6 (branch wip/pdl): programmatic dependent launches on/off (PYKDA_PDL) in one tree:
# outputs bit-identical, graph tests, A/B of launch-bound rows
export PYKDA_CACHE_DIR=${PYKDA_CACHE_DIR:-$PWD/.kcache} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
PYKDA_PDL=0 python docs/studies/pdl/exact.py head 2>&1 | tail -1 | cut -c1-60
PYKDA_PDL=1 python docs/studies/pdl/exact.py new 2>&1 | tail -1 | cut -c1-60
python docs/studies/pdl/cmp.py | tee $OUT/exact.txt
timeout 70 python -m pytest -q -x -m gpu tests/test_graphs_gpu.py 2>&1 | tail -2 | tee $OUT/graphs.txt
for rep in 1 2; do for pdl in 0 1; do
  echo "##### $rep PDL=$pdl"
  PYKDA_PDL=$pdl python -m pykda bench kda --shapes 32:200+50+1+261,32:512x4,96:8192 2>&1 | grep -E "^ +[0-9]+ +[0-9]+|host:" | grep -v safe
  PYKDA_PDL=$pdl python docs/studies/pdl/dec_ab.py
done; done 2>&1 | tee $OUT/ab.txt
