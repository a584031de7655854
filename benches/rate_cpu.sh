#!/usr/bin/env bash
# CPU per request at a fixed rate, the gateway against the floor (benches/examples/proxy_floor.rs):
# what a request costs each when the machine is mostly idle between requests, as in the added
# latency measurement of benches/proxy.sh, rather than at saturation.
#
#   RATE=2000 benches/rate_cpu.sh [seconds per load, default 5] [rounds, default 3]
#
# Both are pinned with one `mock-upstream` to CPU $PROXY_CPU (default 1), oha to CPU $OHA_CPU
# (default 0), 64 connections, non-streamed; the gateway has the setup of benches/proxy.sh (limiter
# on, every rate-limit header). Each round loads the gateway then the floor and prints, per
# request: the median latency, CPU time (user + kernel, /proc/PID/stat, 10 ms ticks) and
# voluntary and involuntary context switches (/proc/PID/task/*/status).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
ROUNDS=${2:-3}
RATE=${RATE:-2000}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
cargo build --release -q -p benches --example proxy_floor
UP=4501 GW=4502 FL=4503
taskset -c "$PROXY_CPU" "$BIN/mock-upstream" --port $UP --stream-chunks 50 >/dev/null 2>&1 &
wait_up "http://127.0.0.1:$UP/stats"
full_config "api_base: \"http://127.0.0.1:$UP/v1\"" '["dynamic_rate_limiter_v3"]' > "$TMP/g.yaml"
RUST_LOG=error taskset -c "$PROXY_CPU" "$BIN/gateway-example" --config "$TMP/g.yaml" \
  --host 127.0.0.1 --port $GW --data-dir "$TMP/d" >/dev/null &
GWP=$!
wait_up "http://127.0.0.1:$GW/health/liveliness"
KEY=$(prod_key $GW)
taskset -c "$PROXY_CPU" "$BIN/examples/proxy_floor" $FL "http://127.0.0.1:$UP/v1/chat/completions" &
FLP=$!
wait_up "http://127.0.0.1:$FL/"
BODY='{"model":"load-model","stream":false,"messages":[{"role":"user","content":"hi"}]}'
# "cpu-ticks voluntary involuntary" of process $1, its threads summed.
usage() {
  local v=0 n=0 s
  for s in /proc/"$1"/task/*/status; do
    v=$((v + $(awk '/^voluntary_ctxt/{print $2}' "$s")))
    n=$((n + $(awk '/^nonvoluntary_ctxt/{print $2}' "$s")))
  done
  echo "$(cpu_ticks "$1") $v $n"
}
echo "oha -q $RATE -z ${SECS}s -c 64, $ROUNDS rounds; proxies and upstream on CPU $PROXY_CPU"
for _ in $(seq "$ROUNDS"); do
  for target in gateway floor; do
    if [ $target = gateway ]; then pid=$GWP port=$GW; else pid=$FLP port=$FL; fi
    read -r t0 v0 n0 < <(usage $pid)
    taskset -c "$OHA_CPU" oha --no-tui -q "$RATE" -z "${SECS}s" -c 64 -m POST -T application/json \
      -H "authorization: Bearer $KEY" -d "$BODY" --output-format json \
      "http://127.0.0.1:$port/v1/chat/completions" > "$TMP/oha.json"
    read -r t1 v1 n1 < <(usage $pid)
    python3 - "$target" "$TMP/oha.json" "$t0" "$t1" "$v0" "$v1" "$n0" "$n1" <<'PY'
import json, sys
target, path = sys.argv[1], sys.argv[2]
t0, t1, v0, v1, n0, n1 = map(int, sys.argv[3:])
d = json.load(open(path))
n = sum(d["statusCodeDistribution"].values())
print(f"{target:8} p50 {d['latencyPercentiles']['p50'] * 1e6:5.0f} µs  CPU {(t1 - t0) * 1e4 / n:6.1f} µs"
      f"  voluntary {(v1 - v0) / n:.2f}  involuntary {(n1 - n0) / n:.2f} per request"
      f"  ({n} requests, codes {d['statusCodeDistribution']})")
PY
  done
done
