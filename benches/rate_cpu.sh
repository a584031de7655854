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
start_upstream $UP
start_gateway $GW $UP
start_floor $FL $UP
GWP=${PID_OF[$GW]} FLP=${PID_OF[$FL]}
BODY='{"model":"load-model","stream":false,"messages":[{"role":"user","content":"hi"}]}'
# "cpu-ticks voluntary involuntary" of process $1, its threads summed.
usage() { echo "$(cpu_ticks "$1") $(context_switches "$1")"; }
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
