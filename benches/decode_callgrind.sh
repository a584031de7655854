#!/usr/bin/env bash
# What decoding an upstream's gzip answer costs per request, counted rather than timed
# (valgrind's callgrind, user space): benches/examples/decode_cost.rs reads N answers through
# upstream_client::DecodedBody gzip-encoded and N unencoded (the same type's pass-through); the
# difference per answer is what decoding adds, beside benches/proxy_callgrind.sh's figure for a
# whole proxied request.
#
#   benches/decode_callgrind.sh [stream: false|true, default false] [answers, default 2000]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
STREAM=${1:-false}
N=${2:-2000}
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
cargo build --release -q -p benches --example decode_cost
BIN=${CARGO_TARGET_DIR:-target}/release/examples/decode_cost
scratch
count() { # CODING ANSWERS: instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$1.$2" "$BIN" "$1" "$STREAM" "$2" 2>/dev/null
  awk '/^(summary|totals):/ {print $2; exit}' "$TMP/cg.$1.$2"
}
# Runs of N and 2N answers: the difference leaves out what a run costs once (start-up, encoding).
for coding in identity gzip; do
  one=$(count "$coding" "$N")
  two=$(count "$coding" $((2 * N)))
  echo "$coding $(( (two - one) / N ))"
done | awk -v s="$STREAM" '{per[$1] = $2}
  END {printf "stream=%s: %d instructions per answer passed through, %d decoded from gzip: %d added\n",
       s, per["identity"], per["gzip"], per["gzip"] - per["identity"]}'
