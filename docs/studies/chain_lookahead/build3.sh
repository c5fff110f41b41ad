#!/bin/bash
# Session 66's third round: the ring written by RING_WARPS warps in turns. From this tree with
# lookahead.patch applied (`git apply`; repository root, ~4 min): .la_base (main), .la_r4 (four
# ring warps) and .la_nor (one ring warp that computes nothing: wrong outputs, only its time, to see whether
# the ring's writer bounds the chains) in .la.tar.xz; the kda kernels of all four trees in .kc_la.tar.xz.
# Then, on the device: bash docs/studies/chain_lookahead/round3.sh
set -euo pipefail
rm -rf .la_base .la_r4 .la_nor .kc_la .kc_la.tar.xz .la.tar.xz
mkdir .la_base .la_r4 .la_nor
git archive HEAD pykda templates src pyproject.toml | tar -x -C .la_base
for d in .la_r4 .la_nor; do cp -r pykda templates src pyproject.toml $d/; done
sed -i 's/^RING_WARPS = 2$/RING_WARPS = 4/' .la_r4/pykda/ops/kda.py
sed -i 's/^RING_WARPS = 2$/RING_WARPS = 1/' .la_nor/pykda/ops/kda.py
python - <<'PY'
import pathlib
p = pathlib.Path(".la_nor/templates/kda_recurrence.cu.j2"); s = p.read_text()
a = "      if (j > 0) {\n        mbar_wait(&full_bar[(j - 1) % STAGES]"
assert a in s; p.write_text(s.replace(a, "      if (false) {\n        mbar_wait(&full_bar[(j - 1) % STAGES]"))
PY
grep -q "^RING_WARPS = 4" .la_r4/pykda/ops/kda.py && grep -q "^RING_WARPS = 1" .la_nor/pykda/ops/kda.py
export PYKDA_CACHE_DIR=$PWD/.kc_la
python -m pykda compile --family kda | tail -1
for d in .la_base .la_r4 .la_nor; do (cd $d && python -m pykda compile --family kda | tail -1); done
tar cJf .kc_la.tar.xz .kc_la && tar cJf .la.tar.xz .la_base .la_r4 .la_nor
ls -la .kc_la.tar.xz .la.tar.xz
