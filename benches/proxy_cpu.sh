#!/usr/bin/env bash
# What each proxy of benches/proxy.sh spends of the shared core per request, and so what the
# gateway may spend for proxy.sh's throughput goal (gateway ≥ RATIO × nginx, RATIO default 0.9).
#
#   benches/proxy_cpu.sh [stream: false|true, default false] [requests per load, default 60000 / 6000] [rounds, default 4]
#
# nginx, the gateway and the floor (benches/examples/proxy_floor.rs: hyper's server and the
# gateway's client, none of the gateway's own work), with the setups of proxy.sh, and one
# `mock-upstream` are pinned to CPU $PROXY_CPU (default 1), oha to CPU $OHA_CPU (default 0), 64
# connections. TARGETS="nginx gateway floor own" adds the floor behind the server written for the
# path (FLOOR_SERVER=own); nginx and the gateway are always run. Each round loads every target in
# turn, the order rotating, with N requests, and reads the user and kernel CPU time
# (/proc/PID/stat, 10 ms ticks) of the proxy and of the upstream around its load.
#
# On a core that the proxy and the upstream share, a target's throughput is about 1 / (P + U),
# P the proxy's CPU time per request and U the upstream's. So the gateway reaches RATIO × nginx's
# throughput only while P(gateway) + U(gateway) ≤ (P(nginx) + U(nginx)) / RATIO. The script prints
# that budget for P(gateway) beside what the gateway and the floor spend and, as a check of the
# model, the throughput ratio that the CPU times predict beside the one oha measured.
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM=${1:-false}
N=${2:-$([ "$STREAM" = true ] && echo 6000 || echo 60000)}
ROUNDS=${3:-4}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
RATIO=${RATIO:-0.9}
TARGETS=${TARGETS:-nginx gateway floor}
case "$TARGETS" in "nginx gateway"*) ;; *) echo "TARGETS must start with nginx gateway" >&2; exit 2 ;; esac
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
cargo build --release -q -p benches --example proxy_floor

UP_PORT=4241
declare -A PORT=([nginx]=4242 [gateway]=4243 [floor]=4244 [own]=4245)
start_upstream "$UP_PORT"
start_nginx "${PORT[nginx]}" "$UP_PORT"
start_gateway "${PORT[gateway]}" "$UP_PORT"
if [[ " $TARGETS " == *" floor "* ]]; then start_floor "${PORT[floor]}" "$UP_PORT"; fi
if [[ " $TARGETS " == *" own "* ]]; then start_floor "${PORT[own]}" "$UP_PORT" own; fi
# The process whose CPU time is a target's: nginx's worker (its master only waits).
declare -A PID
for target in $TARGETS; do PID[$target]=${PID_OF[${PORT[$target]}]}; done
PID[nginx]=$(nginx_worker "${PID[nginx]}")
UP_PID=${PID_OF[$UP_PORT]}

BODY="{\"model\":\"load-model\",\"stream\":$STREAM,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
load() { # target requests
  taskset -c "$OHA_CPU" oha --no-tui -n "$2" -c 64 -m POST -T application/json \
    -H "authorization: Bearer $KEY" -d "$BODY" --output-format json \
    "http://127.0.0.1:${PORT[$1]}/v1/chat/completions" > "$TMP/oha.json"
}
# "user kernel voluntary involuntary" of process $1: CPU ticks and context switches.
usage() { echo "$(user_kernel_ticks "$1") $(context_switches "$1")"; }
for target in $TARGETS; do load "$target" 500; done # warm up

echo "stream=$STREAM, $N requests per load, $ROUNDS rounds; oha on CPU $OHA_CPU, proxies and upstream on CPU $PROXY_CPU"
read -ra order <<< "$TARGETS"
for round in $(seq "$ROUNDS"); do
  for i in "${!order[@]}"; do
    target=${order[$(( (i + round - 1) % ${#order[@]} ))]}
    read -r pu0 pk0 pv0 pn0 < <(usage "${PID[$target]}")
    read -r uu0 uk0 uv0 un0 < <(usage "$UP_PID")
    load "$target" "$N"
    read -r pu1 pk1 pv1 pn1 < <(usage "${PID[$target]}")
    read -r uu1 uk1 uv1 un1 < <(usage "$UP_PID")
    python3 - "$TMP/oha.json" "$N" "$target" $((pu1 - pu0)) $((pk1 - pk0)) $((uu1 - uu0)) $((uk1 - uk0)) \
      $((pv1 - pv0)) $((pn1 - pn0)) $((uv1 - uv0)) $((un1 - un0)) >> "$TMP/figures.txt" <<'PY'
import json, sys
path, n, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d = json.load(open(path))
if d["statusCodeDistribution"] != {"200": n}:
    sys.exit(f"{target}: not every request answered 200: {d['statusCodeDistribution']}")
us = [int(t) * 1e4 / n for t in sys.argv[4:8]]  # 10 ms ticks to µs per request
switches = [int(c) / n for c in sys.argv[8:12]]  # per request
print(target, d["summary"]["requestsPerSec"], *(f"{x:.2f}" for x in us), *(f"{x:.3f}" for x in switches))
PY
  done
  tail -n "${#order[@]}" "$TMP/figures.txt" | awk -v r="$round" \
    '{printf "round %s %-8s %7.0f req/s  proxy %5.1f + %5.1f µs, switches %.2f + %.2f  upstream %5.1f + %5.1f µs, switches %.2f + %.2f\n", r, $1, $2, $3, $4, $7, $8, $5, $6, $9, $10}'
done

python3 - "$TMP/figures.txt" "$RATIO" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    target, *figures = line.split()
    rows.setdefault(target, []).append([float(x) for x in figures])
ratio = float(sys.argv[2])
med = {t: [statistics.median(col) for col in zip(*rs)] for t, rs in rows.items()}
print("medians, CPU µs per request (user + kernel):")
for t, (rps, pu, pk, uu, uk, pv, pn, uv, un) in med.items():
    print(f"  {t:8} {rps:7.0f} req/s  proxy {pu:5.1f} + {pk:5.1f} = {pu + pk:5.1f}  "
          f"upstream {uu:5.1f} + {uk:5.1f} = {uu + uk:5.1f}  together {pu + pk + uu + uk:5.1f}; "
          f"context switches a request, voluntary + involuntary: proxy {pv:.2f} + {pn:.2f}, "
          f"upstream {uv:.2f} + {un:.2f}")
proxy = {t: m[1] + m[2] for t, m in med.items()}
upstream = {t: m[3] + m[4] for t, m in med.items()}
for t in med:
    if t == "nginx":
        continue
    predicted = (proxy["nginx"] + upstream["nginx"]) / (proxy[t] + upstream[t])
    print(f"  {t} / nginx throughput: {med[t][0] / med['nginx'][0]:.3f} measured, "
          f"{predicted:.3f} from CPU per request")
budget = (proxy["nginx"] + upstream["nginx"]) / ratio - upstream["gateway"]
print(f"{ratio} × nginx allows the gateway {budget:.1f} µs a request; it spends {proxy['gateway']:.1f} "
      f"({proxy['gateway'] - budget:+.1f})")
for t in ("floor", "own"):
    if t in proxy:
        print(f"  {t} spends {proxy[t]:.1f}: {budget - proxy[t]:+.1f} µs left for the gateway's own work "
              f"(it spends {proxy['gateway'] - proxy[t]:.1f} over the {t})")
PY
