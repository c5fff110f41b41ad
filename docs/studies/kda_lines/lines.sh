#!/bin/bash
# One kernel of chunk_kda by source line (softplus gate): ncu's source counters (instructions, shared
# wavefronts, warp-stall samples) per SASS instruction, from the second of two calls, joined with the
# -lineinfo cubin's line table. Run from the repository root on the GPU machine (~90 s each):
#   bash docs/studies/kda_lines/lines.sh                      kda_prepare, H=96 T=8192
#   bash docs/studies/kda_lines/lines.sh 16 65536 kda_recurrence MAP=True 2   pass 1 of a long row
# (arguments: H T template [NAME=VALUE] [launches of that template to skip]); writes under $OUT/lines_*.
set -euo pipefail
H=${1:-96}; T=${2:-8192}; TPL=${3:-kda_prepare}; WHERE=${4:-}; SKIP=${5:-1}
DIR=${OUT:-.}/lines_${TPL}_${H}_${T}; mkdir -p "$DIR"
HERE=docs/studies/kda_lines
export PYTHONPATH=.:${PYTHONPATH:-}
python $HERE/run_call.py "$H" "$T" --out "$DIR" --template "$TPL" --where "$WHERE"   # compile outside the profile
/usr/local/cuda/bin/ncu --clock-control none --kernel-name "regex:$TPL" --launch-skip "$SKIP" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  python $HERE/run_call.py "$H" "$T" > "$DIR/source.csv"
/usr/local/cuda/bin/nvdisasm -c -gi "$DIR/kernel.cubin" > "$DIR/kernel.sass"
python $HERE/lines.py "$DIR/source.csv" "$DIR/kernel.sass" "$DIR/kernel.cu" > "$DIR/lines.txt"
head -c 9000 "$DIR/lines.txt"
