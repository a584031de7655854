#!/usr/bin/env bash
# Two gateway builds side by side in front of one `mock-upstream`: the CPU time each spends per
# proxied request, in alternating rounds, so machine noise hits both alike (a throughput ratio
# against nginx moves by ±10 % between runs on this VM; CPU per request of two builds measured in
# the same minute moves much less).
#
#   BASELINE_BIN=path/to/gateway-example benches/proxy_ab.sh [stream: false|true] [requests] [rounds]
#
# Build the baseline with the tree's release profile (root Cargo.toml: fat LTO, one codegen unit);
# one built with another profile makes the ratio measure the profile, not the change.
# The builds are this tree's release `gateway-example` ("new"; NEW_BIN=path for another, e.g. the
# baseline again, to see the harness's own spread) and BASELINE_BIN ("base"), both with the setup
# of benches/proxy.sh (limiter on, every rate-limit header), both pinned with the upstream to CPU
# $PROXY_CPU (default 1), oha on CPU $OHA_CPU (default 0), 64 connections. Each round loads base
# then new (new then base in even rounds) with N requests (default 60000 non-streamed, 6000
# streamed) and reads each process's user and kernel CPU time (/proc/PID/stat) around its load. Prints the
# per-round figures, then medians and the new / base ratio. PROMPT_BYTES=N makes the user message
# N bytes of words (default: "hi"); PROVIDER_HEADERS=1 has the mock send the other headers OpenAI
# sends on an answer.
# FLOOR_AB=1 compares the two servers of benches/examples/proxy_floor.rs instead: hyper's ("base")
# against the one written for the path (FLOOR_SERVER=own, "new"); BASELINE_BIN is not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM=${1:-false}
N=${2:-$([ "$STREAM" = true ] && echo 6000 || echo 60000)}
ROUNDS=${3:-5}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
[ -n "${FLOOR_AB:-}" ] ||
  : "${BASELINE_BIN:?set BASELINE_BIN to the gateway-example binary to compare against}"
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
# Nothing is built when NEW_BIN names the new build.
GATEWAY_BIN=${NEW_BIN:-} build_and_scratch
UP_PORT=4231

start_upstream "$UP_PORT"
declare -A PID PORT KEYS
PORT[base]=4232 PORT[new]=4233
[ -n "${FLOOR_AB:-}" ] && cargo build --release -q -p benches --example proxy_floor
for build in base new; do
  if [ -n "${FLOOR_AB:-}" ]; then
    server=hyper
    [ "$build" = new ] && server=own
    start_floor "${PORT[$build]}" "$UP_PORT" "$server"
    KEYS[$build]=none
  else
    bin=${NEW_BIN:-$BIN/gateway-example}
    [ "$build" = base ] && bin=$BASELINE_BIN
    GATEWAY_BIN=$bin start_gateway "${PORT[$build]}" "$UP_PORT"
    KEYS[$build]=$KEY
  fi
  PID[$build]=${PID_OF[${PORT[$build]}]}
done
BODY="{\"model\":\"load-model\",\"stream\":$STREAM,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"$(prompt_text)\"}]}"
load() { # build requests
  taskset -c "$OHA_CPU" oha --no-tui -n "$2" -c 64 -m POST -T application/json \
    -H "authorization: Bearer ${KEYS[$1]}" -d "$BODY" \
    "http://127.0.0.1:${PORT[$1]}/v1/chat/completions" > "$TMP/oha.txt"
  grep -q "\[200\] $2 responses" "$TMP/oha.txt" || { echo "not every request answered 200" >&2; cat "$TMP/oha.txt" >&2; exit 1; }
}
for build in base new; do load "$build" 500; done # warm up
echo "stream=$STREAM, $N requests per load, $ROUNDS rounds: CPU µs per request (user + kernel)"
for round in $(seq "$ROUNDS"); do
  line="round $round:"
  # The order alternates, so whatever the first or second load of a round pays hits both builds.
  order="base new"
  [ $((round % 2)) = 0 ] && order="new base"
  for build in $order; do
    before=$(cpu_ticks "${PID[$build]}")
    load "$build" "$N"
    after=$(cpu_ticks "${PID[$build]}")
    us=$(python3 -c "print(f'{($after - $before) * 10000 / $N:.1f}')")
    echo "$build $us" >> "$TMP/figures.txt"
    line="$line $build $us"
  done
  echo "$line"
done
python3 - "$TMP/figures.txt" <<'PY'
import statistics, sys
figures = {}
for line in open(sys.argv[1]):
    build, us = line.split()
    figures.setdefault(build, []).append(float(us))
base, new = statistics.median(figures["base"]), statistics.median(figures["new"])
ratios = [n / b for b, n in zip(figures["base"], figures["new"]) if b]
print(f"median: base {base:.1f} µs, new {new:.1f} µs; new / base {new / base:.3f} "
      f"(per round {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f})")
PY
