#!/usr/bin/env bash
# What forwarding to an upstream costs: the gateway against nginx, both in front of the same
# `mock-upstream`, and the upstream alone.
#
#   benches/proxy.sh [seconds per run, default 6] [concurrency, default 64] [rounds, default 3]
#
# The targets, each loaded with oha pinned to CPU $OHA_CPU (default 0) while the proxy and the
# mock upstream share CPU $PROXY_CPU (default 1):
#   direct   mock-upstream alone;
#   nginx    nginx (Debian's package, installed when missing): proxy_pass to an upstream block
#            with keepalive 64, limit_req with a rate far above the load, proxy_buffering off;
#   gateway  gateway-example with the limiter on and every rate-limit header (rpm and tpm, two
#            priorities: the CONFIG=full setup of benches/load.sh), one upstream deployment;
#   floor    benches/examples/proxy_floor.rs: the gateway's server settings and upstream client
#            and nothing else (no key, JSON, limiter, router or metering), the least a proxy on
#            this stack costs: gateway / floor is what the gateway's own work costs, floor / nginx
#            what the stack does;
#   own      (only when TARGETS names it) the floor with FLOOR_SERVER=own: the same client behind
#            a server side written for this path instead of hyper's, what replacing hyper's server
#            could save (own / floor).
# TARGETS="direct nginx gateway floor own" picks the targets (default: all but own; direct and
# nginx are always run, the ratios are against them).
# The mock answers with STREAM_CHUNKS (default 50) words, so a stream is a role chunk, 50
# content chunks, a finish chunk and a usage chunk (every client asks for it with
# stream_options.include_usage, so the gateway strips nothing and all targets send the same bytes).
# Each round runs every target non-streamed then streamed, in turn, so machine noise hits all of
# them alike; figures are medians over rounds, and the gateway / nginx ratio is also given per
# round (runs of one round are adjacent in time) with the median of those. Then at a fixed RATE (default 2000 req/s,
# non-streamed) the median latency of each target, and what a proxy adds over going direct.
# Only loopback addresses are used. Installs oha and nginx when missing (as root: no sudo).
# GATEWAY_BIN=path runs that gateway binary instead of this tree's (to compare two builds).
# PROVIDER_HEADERS=1 has the mock send the other headers OpenAI sends on an answer (14 of them):
# nginx and the floor pass them on, the gateway reads the few it needs and drops the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-6}
CONC=${2:-64}
ROUNDS=${3:-3}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
RATE=${RATE:-2000}
STREAM_CHUNKS=${STREAM_CHUNKS:-50}
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
cargo build --release -q -p benches --example proxy_floor

UP_PORT=4201 NGINX_PORT=4202 GW_PORT=4203 FLOOR_PORT=4204 OWN_PORT=4205
TARGETS=${TARGETS:-direct nginx gateway floor}
case "$TARGETS" in "direct nginx" | "direct nginx "*) ;; *) echo "TARGETS must start with direct nginx" >&2; exit 2 ;; esac

start_upstream "$UP_PORT"
start_nginx "$NGINX_PORT" "$UP_PORT"
start_gateway "$GW_PORT" "$UP_PORT"
start_floor "$FLOOR_PORT" "$UP_PORT"
if [[ " $TARGETS " == *" own "* ]]; then start_floor "$OWN_PORT" "$UP_PORT" own; fi

declare -A URL=([direct]="http://127.0.0.1:$UP_PORT/v1/chat/completions"
                [nginx]="http://127.0.0.1:$NGINX_PORT/v1/chat/completions"
                [gateway]="http://127.0.0.1:$GW_PORT/v1/chat/completions"
                [floor]="http://127.0.0.1:$FLOOR_PORT/v1/chat/completions"
                [own]="http://127.0.0.1:$OWN_PORT/v1/chat/completions")
body() { # $1 = stream
  local opts=''
  [ "$1" = true ] && opts=',"stream_options":{"include_usage":true}'
  echo "{\"model\":\"load-model\",\"stream\":$1$opts,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
}
load() { # $1 target, $2 stream, $3 output file, then extra oha flags
  local target=$1 stream=$2 out=$3; shift 3
  taskset -c "$OHA_CPU" oha --no-tui "$@" -m POST -T application/json -H "authorization: Bearer $KEY" \
      -d "$(body "$stream")" --output-format json "${URL[$target]}" > "$out"
}
# A stream through the gateway carries the chunks the upstream sent (checked once, not timed).
chunks=$(curl -sN "${URL[gateway]}" -H "authorization: Bearer $KEY" -H 'content-type: application/json' \
          -d "$(body true)" | grep -c '^data: ')
echo "gateway stream: $chunks SSE events (data lines, [DONE] included)"

echo "oha -z ${SECS}s -c $CONC, $ROUNDS rounds; oha on CPU $OHA_CPU; upstream and proxy on CPU $PROXY_CPU; stream of $STREAM_CHUNKS words"
for round in $(seq "$ROUNDS"); do
  for stream in false true; do
    for target in $TARGETS; do
      load "$target" "$stream" "$TMP/$target-$stream-$round.json" -z "${SECS}s" -c "$CONC"
    done
  done
done
echo "fixed rate: oha -q $RATE -z ${SECS}s -c $CONC, $ROUNDS rounds, not streamed"
for round in $(seq "$ROUNDS"); do
  for target in $TARGETS; do
    load "$target" false "$TMP/$target-rate-$round.json" -q "$RATE" -z "${SECS}s" -c "$CONC"
  done
done

python3 - "$TMP" "$ROUNDS" $TARGETS <<'PY'
import json, statistics, sys
d, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
pairs = [(a, b) for a, b in (("gateway", "nginx"), ("floor", "nginx"), ("gateway", "floor"),
                             ("own", "nginx"), ("own", "floor")) if a in targets and b in targets]
def runs(name):
    return [json.load(open(f"{d}/{name}-{r}.json")) for r in range(1, rounds + 1)]
def all_ok(rs):
    return all(set(r.get("statusCodeDistribution", {})) == {"200"} for r in rs)
for stream in ("false", "true"):
    med = {}
    for target in targets:
        rs = runs(f"{target}-{stream}")
        rps = [r["summary"]["requestsPerSec"] for r in rs]
        med[target] = statistics.median(rps)
        p50 = statistics.median(r["latencyPercentiles"]["p50"] * 1000 for r in rs)
        print(f"{target:>7} stream={stream:<5} rps median={med[target]:8.0f} "
              f"(runs {', '.join(f'{x:.0f}' for x in rps)}) p50={p50:5.2f}ms all-200={all_ok(rs)}")
    # The same round's runs are minutes apart at most: their ratio shares the machine's drift.
    for a, b in pairs:
        paired = [x["summary"]["requestsPerSec"] / y["summary"]["requestsPerSec"]
                  for x, y in zip(runs(f"{a}-{stream}"), runs(f"{b}-{stream}"))]
        print(f"        stream={stream:<5} {a} / {b} = {med[a] / med[b]:.3f} (medians); "
              f"per round {', '.join(f'{x:.3f}' for x in paired)}, median {statistics.median(paired):.3f}")
p50 = {}
for target in targets:
    rs = runs(f"{target}-rate")
    each = [r["latencyPercentiles"]["p50"] * 1e6 for r in rs]
    p50[target] = statistics.median(each)
    rps = statistics.median(r["summary"]["requestsPerSec"] for r in rs)
    print(f"{target:>7} fixed rate {rps:6.0f} req/s: p50 median={p50[target]:6.0f} µs "
          f"(runs {', '.join(f'{x:.0f}' for x in each)}) all-200={all_ok(rs)}")
for target in targets[1:]:
    print(f"        {target} adds {p50[target] - p50['direct']:5.0f} µs to the median at the fixed rate")
PY
