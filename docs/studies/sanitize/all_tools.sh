# All four compute-sanitizer tools over the whole sanitize list (issue 14) in one device call
# (~7 min), from the repository root, carry [".kc_all.tar.xz"] (every registry kernel, plain and
# PYKDA_SANITIZE builds: see docs/studies/compat/compat_round.sh).
# Session 40 on the H200 (65 tests): memcheck, synccheck, initcheck `PASS | 65 passed in 4 shards |
# ERROR SUMMARY: 0 errors` (each tool under a minute); racecheck in 4 shards of 200 s: two shards
# timed out, so it runs in 8 (shards took 90-243 s): `racecheck PASS | 65 passed in 8 shards |
# RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)`.
tar xJf .kc_all.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_all
mkdir -p $OUT
timeout 200 python -m pykda sanitize --tool memcheck,synccheck,initcheck --shards 4 --timeout 90 \
  --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
timeout 390 python -m pykda sanitize --tool racecheck --shards 8 --timeout 370 --log-dir /tmp/racecheck \
  > $OUT/racecheck.log 2>&1   # (its eight logs stay there: a call brings back few files)
tail -4 $OUT/sanitize.log; tail -2 $OUT/racecheck.log
