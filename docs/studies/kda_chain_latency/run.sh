#!/bin/bash
# One device call for the patch, from the repository root (PYKDA_CACHE_DIR set to a carried cache):
# this tree copied under .dev/head, and patched under .dev/patched.
set -u
R=$PWD
rm -rf .dev/head .dev/patched && mkdir -p .dev/head .dev/patched
cp -r pykda templates src tests .dev/head/
cp -r pykda templates src tests .dev/patched/
git apply --directory=.dev/patched docs/studies/kda_chain_latency/chain_overlap.patch
# 1. GPU tests and racecheck of the patched kernels
(cd .dev/patched && PYTHONPATH=$PWD python -m pytest -q -x -m gpu tests/test_kda_segments_gpu.py tests/test_kda_gpu.py 2>&1 | tail -2)
(cd .dev/patched && PYTHONPATH=$PWD PYKDA_SANITIZE=1 /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
   python -m pytest -q -p no:cacheprovider "tests/test_kda_segments_gpu.py::test_warpgroup_products_match_reference[batch-0-True]" 2>&1 | tail -3)
# 2. the A/B, twice
S=96:1300+547+2048+963+271+3063,64:1024x8,8:131072,1:1048576,96:8192
for rep in 1 2; do for tree in head patched; do
  echo "##### $rep $tree"
  (cd .dev/$tree && PYTHONPATH=$PWD python -m pykda bench kda --shapes $S --warps auto --json /dev/null 2>&1 | grep -E "^ +[0-9]+ " | grep softplus)
done; done
