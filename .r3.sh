source docs/studies/flashinfer_warm/device_env.sh .kc_49
timeout 90 python docs/studies/decode_tiny/ab.py > $OUT/ab.log 2>&1
timeout 200 python -m pykda bench paged-decode --grid --max-seconds 180 --json $OUT/paged.json > $OUT/paged.log 2>&1
grep -v Warn $OUT/ab.log | tail -12
grep -E "^paged grid" $OUT/paged.log
