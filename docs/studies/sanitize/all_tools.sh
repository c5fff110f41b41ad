# All four compute-sanitizer tools over the whole sanitize list (issue 14), four shards a tool, in
# one device call (~5 min), from the repository root, carry [".kc_all.tar.xz"] (every registry kernel,
# plain and PYKDA_SANITIZE builds: see docs/studies/compat/compat_round.sh). Session 23 ran
# memcheck, synccheck and initcheck over the list (0 errors) and racecheck to 57 of 58 tests before
# its time limit; session 37 racecheck over the decode tests to 16 of 25.
tar xJf .kc_all.tar.xz
export PYTHONPATH=.:$PYTHONPATH PYKDA_CACHE_DIR=$PWD/.kc_all
mkdir -p $OUT
timeout 540 python -m pykda sanitize --shards 4 --timeout 200 --log-dir $OUT/sanitize > $OUT/sanitize.log 2>&1
tail -8 $OUT/sanitize.log
