#!/usr/bin/env bash
# What the request record (general_settings.record) costs: two gateways of this tree's release
# build side by side in front of one `mock-upstream`, "off" (benches/proxy.sh's full config) and
# "on" (the same with `record: {path: …, sample: $SAMPLE}`), loaded in alternating rounds
# so machine noise hits both alike. Prints per round each one's throughput (oha's requests/s)
# and CPU time per request, then the on / off throughput ratio (median of the rounds' ratios; the
# goal is ≥ 0.97) and the lines written and dropped.
#
#   benches/record.sh [stream: false|true] [requests] [rounds]
#
# SAMPLE=0.1 records a tenth of the requests (default 1: all).
# Pinning as benches/proxy_ab.sh: the gateways (with the record's writer thread) and the upstream
# on CPU $PROXY_CPU (default 1), oha on CPU $OHA_CPU (default 0), 64 connections.
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM=${1:-false}
N=${2:-$([ "$STREAM" = true ] && echo 6000 || echo 40000)}
ROUNDS=${3:-6}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
UP_PORT=4241
start_upstream "$UP_PORT"
declare -A PID PORT KEYS
PORT[off]=4242 PORT[on]=4243
for build in off on; do
  port=${PORT[$build]}
  full_config "api_base: \"http://127.0.0.1:$UP_PORT/v1\"" '["dynamic_rate_limiter_v3"]' > "$TMP/gateway-$port.yaml"
  [ "$build" = on ] && echo "  record: {path: $TMP/record.jsonl, sample: ${SAMPLE:-1}}" >> "$TMP/gateway-$port.yaml"
  RUST_LOG=error taskset -c "$PROXY_CPU" "$BIN/gateway-example" --config "$TMP/gateway-$port.yaml" \
    --host 127.0.0.1 --port "$port" --data-dir "$TMP/gateway-data-$port" >/dev/null &
  PID[$build]=$!
  wait_up "http://127.0.0.1:$port/health/liveliness"
  KEYS[$build]=$(prod_key "$port")
done
BODY="{\"model\":\"load-model\",\"stream\":$STREAM,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"$(prompt_text)\"}]}"
load() { # build requests
  taskset -c "$OHA_CPU" oha --no-tui -n "$2" -c 64 -m POST -T application/json \
    -H "authorization: Bearer ${KEYS[$1]}" -d "$BODY" \
    "http://127.0.0.1:${PORT[$1]}/v1/chat/completions" > "$TMP/oha.txt"
  grep -q "\[200\] $2 responses" "$TMP/oha.txt" || { echo "not every request answered 200" >&2; cat "$TMP/oha.txt" >&2; exit 1; }
  awk '/Requests\/sec:/ {print $2; exit}' "$TMP/oha.txt"
}
for build in off on; do load "$build" 500 >/dev/null; done # warm up
echo "stream=$STREAM, $N requests per load, $ROUNDS rounds: requests/s and CPU µs per request"
for round in $(seq "$ROUNDS"); do
  line="round $round:"
  order="off on"
  [ $((round % 2)) = 0 ] && order="on off"
  for build in $order; do
    before=$(cpu_ticks "${PID[$build]}")
    rps=$(load "$build" "$N")
    after=$(cpu_ticks "${PID[$build]}")
    us=$(python3 -c "print(f'{($after - $before) * 10000 / $N:.1f}')")
    echo "$round $build $rps $us" >> "$TMP/figures.txt"
    line="$line $build ${rps%.*}/s ${us}µs"
  done
  echo "$line"
done
python3 - "$TMP/figures.txt" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    round_, build, rps, us = line.split()
    rows.setdefault(round_, {})[build] = (float(rps), float(us))
ratios = [r["on"][0] / r["off"][0] for r in rows.values()]
cpu = [r["on"][1] / r["off"][1] for r in rows.values()]
print(f"throughput on / off: median {statistics.median(ratios):.3f} "
      f"(per round {', '.join(f'{x:.3f}' for x in ratios)})")
print(f"CPU per request on / off: median {statistics.median(cpu):.3f}")
PY
metrics=$(curl -s "http://127.0.0.1:${PORT[on]}/metrics")
echo "record: $(grep -E '^gateway_record_(lines|dropped)_total' <<<"$metrics" | tr '\n' ' ')"
