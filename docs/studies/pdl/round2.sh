#!/bin/bash
# session 24 round 2: graph tests and the A/B after the graph-driver fix, then memcheck and synccheck over the list
export PYKDA_CACHE_DIR=$PWD/.kc PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python -m pytest -q -m gpu tests/test_graphs_gpu.py tests/test_kda_decode_gpu.py tests/test_compat_gpu.py 2>&1 | tail -2 | tee $OUT/graphs.txt
for rep in 1 2; do for pdl in 0 1; do
  echo "##### $rep PDL=$pdl"
  PYKDA_PDL=$pdl python -m pykda bench kda --shapes 32:200+50+1+261,32:512x4,96:8192 2>&1 | grep -E "^ +[0-9]+ +[0-9]+|host:" | grep -v safe
  PYKDA_PDL=$pdl python docs/studies/pdl/dec_ab.py
done; done 2>&1 | tee $OUT/ab.txt
timeout 330 python -m pykda sanitize --tool memcheck,synccheck --log-dir $OUT/san 2>&1 | tail -6 | tee $OUT/san.txt
echo "=== summary"; cat $OUT/graphs.txt $OUT/ab.txt $OUT/san.txt
