# The shared start of this study's device rounds, sourced from the repository root:
#   source docs/studies/merge_online/prelude.sh CACHE BASELINE TEST_FILE...
# unpacks CACHE.tar.xz (this tree's decode kernels) and BASELINE.tar.xz (the tree compared against) where
# they are not unpacked yet, names the GPU, and runs TEST_FILEs' GPU tests on this tree with CACHE's kernels
# (their summary in $OUT/tests.txt).
set -o pipefail
export PYTHONUNBUFFERED=1
[ -d "$1" ] || tar xJf "$1.tar.xz" || exit 1
[ -d "$2" ] || tar xJf "$2.tar.xz" || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PYKDA_CACHE_DIR=$PWD/$1 PYTHONPATH=. timeout 150 python -m pytest -q -x -p no:cacheprovider -m gpu "${@:3}" 2>&1 \
  | tail -2 | tee $OUT/tests.txt
