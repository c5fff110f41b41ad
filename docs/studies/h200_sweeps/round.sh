#!/bin/bash
# Session 65: the planner's settings swept on an H200 (repository root). pykda only, no peers:
# decode_partial's pipeline depth on the few-unit rows (FEW_UNITS_STAGES was measured on an H100), and
# the long KDA rows' segment length and warps. By default main's kernels come from .kc_h2.tar.xz (carried;
# main's kda and decode kernels in .kc_so) and the tree is this one; a caller with its own sets
#   KC    the kernel cache directory, already there
#   TREE  the tree to time (default .)
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -z "${KC:-}" ]; then tar xJf .kc_h2.tar.xz || exit 1; KC=.kc_so; fi
export PYKDA_CACHE_DIR=$PWD/$KC
cd "${TREE:-.}" || exit 1
export PYTHONPATH=.
timeout 120 python -m pykda bench decode --stages 4,5,6 \
  --shapes 32/32:8192,16/16:8192,32/8:131072,128/8:65536,64/8:50000,8/1:1048576 \
  > $OUT/decode_stages.txt 2>&1
echo "decode at ${SECONDS}s"
timeout 120 python -m pykda bench kda --shapes 16:65536,8:131072,1:1048576 --segment-chunks 256,512,1024 \
  --warps 4,8 > $OUT/kda_segments.txt 2>&1
echo "kda at ${SECONDS}s"
grep -v "%|" $OUT/decode_stages.txt | tail -40
grep -v "%|" $OUT/kda_segments.txt | tail -30
