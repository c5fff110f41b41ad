# Session 48, from the repository root (~3 min, any card): a graph launch skips the parameter copies
# when the call's values are those its nodes hold (runtime.LaunchGraph). The graph GPU tests, then
# breakdown.py with the previous tree beside as pykda_base (`git archive` of pykda before it, renamed; carried
# with .kc_48.tar.xz, main's decode kernels: the KDA kernels compile on the device).
[ -d .kc_48 ] || tar xJf .kc_48.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_48
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_graphs_gpu.py > $OUT/graphs.log 2>&1
echo "graph GPU tests: $(grep -E 'passed|failed' $OUT/graphs.log | tail -1)"; grep -E "^(E  |FAILED)" $OUT/graphs.log | head
timeout 150 python docs/studies/kda_host/breakdown.py 2>&1 | grep -v Warn | tail -30
