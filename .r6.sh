bash docs/studies/decode_tiny/land_round.sh
