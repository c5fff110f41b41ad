#!/bin/bash
# The next device call's two tarballs, built from a clean tree of main (repository root; ~8 min on two
# cores). It applies lookahead.patch to this tree, and makes:
#   .la.tar.xz     .la_base (main) and .la_p1 (main with lookahead_pass1.patch)
#   .kc_la.tar.xz  .kc_la: the kda kernels of all three trees, and main's decode kernels (for the sweeps)
# Then, on the device, carrying both: bash docs/studies/chain_lookahead/round.sh
set -euo pipefail
rm -rf .la_base .la_p1 .kc_la .kc_la.tar.xz .la.tar.xz
mkdir .la_base .la_p1
git archive HEAD pykda templates src pyproject.toml | tar -x -C .la_base
git archive HEAD pykda templates src pyproject.toml | tar -x -C .la_p1
(cd .la_p1 && patch -p1 -s < ../docs/studies/chain_lookahead/lookahead_pass1.patch)
git apply docs/studies/chain_lookahead/lookahead.patch
export PYKDA_CACHE_DIR=$PWD/.kc_la
python -m pykda compile --family kda | tail -1
(cd .la_base && python -m pykda compile --family kda | tail -1 && python -m pykda compile --family decode | tail -1)
(cd .la_p1 && python -m pykda compile --family kda | tail -1)
tar cJf .kc_la.tar.xz .kc_la && tar cJf .la.tar.xz .la_base .la_p1
ls -la .kc_la.tar.xz .la.tar.xz
