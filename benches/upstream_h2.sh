#!/usr/bin/env bash
# What speaking HTTP/2 to an upstream would cost the gateway's client per request, against the
# HTTP/1.1 client it has (benches/upstream_h2: a workspace of its own, so hyper's http2 feature
# stays out of the gateway's build).
#
#   benches/upstream_h2.sh [requests per run, default 200000] [rounds, default 5] [concurrency, default 64]
#
# The server (HTTP/1.1 and HTTP/2 with prior knowledge, one fixed chat completion) runs on CPU
# $SERVER_CPU (default 0), the client on CPU $CLIENT_CPU (default 1). Each round runs the client
# with h1 then h2 (h2 then h1 in even rounds); it prints its own CPU time per request. Medians
# over the rounds, and h2 / h1, at the end.
set -euo pipefail
cd "$(dirname "$0")/upstream_h2"
. ../common.sh
N=${1:-200000}
ROUNDS=${2:-5}
CONC=${3:-64}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q
BIN=$CARGO_TARGET_DIR/release/upstream_h2
scratch
PORT=$(free_port)
taskset -c "$SERVER_CPU" "$BIN" server "$PORT" &
wait_up "http://127.0.0.1:$PORT/"
for round in $(seq "$ROUNDS"); do
  order="h1 h2"
  [ $((round % 2)) = 0 ] && order="h2 h1"
  for version in $order; do
    line=$(taskset -c "$CLIENT_CPU" "$BIN" client "$version" "http://127.0.0.1:$PORT/v1/chat/completions" "$N" "$CONC")
    echo "round $round $line"
    echo "$line" >> "$TMP/lines"
  done
done
python3 - "$TMP/lines" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(h[12]): (\d+) req/s; client CPU per request: user ([\d.]+) µs, kernel ([\d.]+) µs", line)
    v, rps, user, kernel = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
    runs.setdefault(v, []).append((rps, user, kernel))
med = {v: [statistics.median(x[i] for x in r) for i in range(3)] for v, r in runs.items()}
for v in ("h1", "h2"):
    rps, user, kernel = med[v]
    print(f"{v}: median {rps:.0f} req/s, client CPU per request user {user:.1f} µs + kernel {kernel:.1f} µs = {user + kernel:.1f} µs")
total = lambda v: med[v][1] + med[v][2]
print(f"h2 / h1 client CPU per request: {total('h2') / total('h1'):.2f}; "
      f"requests/s: {med['h2'][0] / med['h1'][0]:.2f}")
PY
