#!/usr/bin/env bash
# Routing at and past capacity, over HTTP: 4 mock deployments with a fixed RPM each behind the
# gateway, offered 90%, 100% and 120% of their total for a few windows, under two policies:
#
#   source  the source product's: no gateway-side limits, simple-shuffle, a deployment whose
#           upstream answers 429 is removed for the next minute (cooldown_time: 60), and the
#           upstream's 429 carries no retry-after / x-ratelimit-* headers (as with many providers);
#   ours    per-deployment rpm in the gateway (full deployments skipped before dispatch, back when
#           their window has room), the default strategy, upstream headers honoured;
#   learned ours without gateway-side rpm: the router only learns the upstreams' limits from their
#           429 + retry-after and x-ratelimit-* headers.
#
#   [POLICIES="source ours"] [LOADS="90 100 120"] benches/routing_load.sh [seconds per run, default 120] [rpm per deployment, default 600]
#
# Each run starts a fresh mock-upstream and gateway (clean windows), drives it with oha at a fixed
# request rate, and prints served / refused / other counts, the share of capacity served, and
# p50/p99 latency. Capacity = 4 × rpm × seconds / 60. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
SECS=${1:-120}
RPM=${2:-600}
POLICIES=${POLICIES:-source ours}
LOADS=${LOADS:-90 100 120}
need_oha
build_and_scratch
GW=$BIN/gateway-example
MOCK=$BIN/mock-upstream

config() { # $1 = policy, $2 = first mock port
  echo "model_list:"
  for i in 0 1 2 3; do
    local port=$(($2 + i)) limits=""
    [ "$1" = ours ] && limits=", rpm: $RPM"
    echo "  - model_name: g"
    echo "    litellm_params: {model: openai/mock-model, api_base: \"http://127.0.0.1:$port/v1\"$limits}"
  done
  echo "router_settings:"
  if [ "$1" = source ]; then
    echo "  routing_strategy: simple-shuffle"
    echo "  cooldown_time: 60"
  fi
  echo "  num_retries: 2"
  echo "general_settings:"
  echo "  master_key: sk-load-master"
}

run() { # $1 = policy, $2 = offered percent
  local policy=$1 pct=$2 mock_port=9101 gw_port headers=""
  gw_port=$(free_port)
  [ "$policy" = source ] && headers="--no-rate-limit-headers"
  RUST_LOG=error "$MOCK" --ports $mock_port,$((mock_port + 1)),$((mock_port + 2)),$((mock_port + 3)) \
    --rpm "$RPM" --latency exp --latency-ms 50 $headers > "$TMP/mock.out" 2>/dev/null &
  local mock_pid=$!
  config "$policy" $mock_port > "$TMP/gw.yaml"
  RUST_LOG=error "$GW" --config "$TMP/gw.yaml" --host 127.0.0.1 --port $gw_port --data-dir "$TMP/data" &
  local gw_pid=$!
  wait_up "http://127.0.0.1:$gw_port/health/liveliness"
  local rate
  rate=$(python3 -c "print(4 * $RPM / 60 * $pct / 100)")
  oha --no-tui -z "${SECS}s" -q "$rate" -c 32 -m POST -T application/json \
    -H "authorization: Bearer sk-load-master" \
    -d '{"model":"g","messages":[{"role":"user","content":"hi"}]}' \
    --output-format json "http://127.0.0.1:$gw_port/v1/chat/completions" > "$TMP/$policy-$pct.json"
  kill $gw_pid $mock_pid 2>/dev/null || true
  wait $gw_pid $mock_pid 2>/dev/null || true
  rm -rf "$TMP/data"
}

echo "4 deployments × $RPM rpm, ${SECS}s per run, oha at a fixed rate (capacity $((4 * RPM * SECS / 60)) requests per run)"
for pct in $LOADS; do
  for policy in $POLICIES; do
    run $policy $pct
  done
done

python3 - "$TMP" "$SECS" "$RPM" "$POLICIES" "$LOADS" <<'PY'
import json, sys
d, secs, rpm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
policies, loads = sys.argv[4].split(), [int(x) for x in sys.argv[5].split()]
capacity = 4 * rpm * secs / 60
print(f"| offered | policy | sent | served (200) | refused (429) | other | served / capacity | p50 | p99 |")
print(f"|---|---|---|---|---|---|---|---|---|")
for pct in loads:
    for policy in policies:
        r = json.load(open(f"{d}/{policy}-{pct}.json"))
        codes = r.get("statusCodeDistribution", {})
        ok, limited = codes.get("200", 0), codes.get("429", 0)
        sent = sum(codes.values()) + sum(r.get("errorDistribution", {}).values())
        other = sent - ok - limited
        lat = r["latencyPercentiles"]
        print(f"| {pct}% | {policy} | {sent} | {ok} | {limited} | {other} | {ok / capacity:.1%} "
              f"| {lat['p50'] * 1000:.1f} ms | {lat['p99'] * 1000:.1f} ms |")
PY
