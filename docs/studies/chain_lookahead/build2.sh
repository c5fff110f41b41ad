#!/bin/bash
# Session 66's second round: the ring written by a warp of its own (lookahead.patch as it is now), against
# main, without pass 1 alone and without the decode sweeps. From a clean tree of main (repository root,
# ~2 min): applies lookahead.patch to this tree, makes .la.tar.xz (.la_base: main) and .kc_la.tar.xz (the
# kda kernels of both). Then, on the device: bash docs/studies/chain_lookahead/round2.sh
set -euo pipefail
rm -rf .la_base .kc_la .kc_la.tar.xz .la.tar.xz
mkdir .la_base
git archive HEAD pykda templates src pyproject.toml | tar -x -C .la_base
git apply docs/studies/chain_lookahead/lookahead.patch
export PYKDA_CACHE_DIR=$PWD/.kc_la
python -m pykda compile --family kda | tail -1
(cd .la_base && python -m pykda compile --family kda | tail -1)
tar cJf .kc_la.tar.xz .kc_la && tar cJf .la.tar.xz .la_base
ls -la .kc_la.tar.xz .la.tar.xz
