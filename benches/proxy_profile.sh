#!/usr/bin/env bash
# Where a proxied request's time goes, as the figures of benches/RESULTS.md ("Proxy path") were
# taken: the gateway (the setup of benches/proxy.sh: limiter on, every rate-limit header) and
# `mock-upstream --stream-chunks 50` pinned together on CPU $PROXY_CPU (default 1), oha on
# $OHA_CPU (default 0), 64 connections.
#
#   benches/proxy_profile.sh [stream: false|true, default false] [requests, default 60000 / 6000]
#
# Prints, for one load of N requests:
#   - CPU time per request of the gateway and of the upstream, user and kernel (/proc/PID/stat);
#   - the gateway's task-clock and context switches (`perf stat`);
#   - its syscalls per request by kind (`strace -c -f`, a second, smaller load: strace slows it);
#   - its hottest functions (`perf record -g`, `perf report --no-children`, top 25), the whole
#     report kept in $OUT (default: a temporary directory, removed at exit) as perf.data.
#     A flamegraph of it (the pictures are not committed): `cargo install --locked inferno`, then
#     `perf script -i $OUT/perf.data | inferno-collapse-perf | inferno-flamegraph > flame.svg`.
# Installs linux-perf, strace and oha when missing (Debian's packages; as root, no sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM=${1:-false}
N=${2:-$([ "$STREAM" = true ] && echo 6000 || echo 60000)}
PROXY_CPU=${PROXY_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
command -v perf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-perf >/dev/null
command -v strace >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q strace >/dev/null
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
OUT=${OUT:-$TMP}
UP_PORT=4221 GW_PORT=4222

start_upstream "$UP_PORT"
start_gateway "$GW_PORT" "$UP_PORT"
UP=${PID_OF[$UP_PORT]} GW=${PID_OF[$GW_PORT]}
BODY="{\"model\":\"load-model\",\"stream\":$STREAM,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
load() {
  taskset -c "$OHA_CPU" oha --no-tui -n "$1" -c 64 -m POST -T application/json \
    -H "authorization: Bearer $KEY" -d "$BODY" "http://127.0.0.1:$GW_PORT/v1/chat/completions" |
    grep -E "Requests/sec|\[[0-9]{3}\]"
}
load 500 >/dev/null # warm up

echo "== stream=$STREAM, $N requests: CPU per request (/proc/PID/stat, 10 ms ticks)"
read -r gu gs < <(user_kernel_ticks $GW); read -r uu us < <(user_kernel_ticks $UP)
perf stat -e task-clock,context-switches -p $GW -o "$TMP/stat.txt" & STAT=$!
sleep 0.2
load "$N"
kill -INT $STAT; wait $STAT 2>/dev/null || true
read -r gu2 gs2 < <(user_kernel_ticks $GW); read -r uu2 us2 < <(user_kernel_ticks $UP)
us_per() { echo "$(( ($2 - $1) * 10000 / N ))"; }
echo "gateway: user $(us_per "$gu" "$gu2") µs, kernel $(us_per "$gs" "$gs2") µs; upstream: user $(us_per "$uu" "$uu2") µs, kernel $(us_per "$us" "$us2") µs"
grep -E "task-clock|context-switches" "$TMP/stat.txt"

M=$(( N / 10 ))
echo "== syscalls per request (strace -c -f, $M requests)"
strace -c -f -p $GW -o "$TMP/strace.txt" & ST=$!
sleep 0.5
load "$M" >/dev/null
kill -INT $ST; wait $ST 2>/dev/null || true
awk -v n="$M" '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" {printf "%-14s %6.2f\n", $NF, $4 / n}' "$TMP/strace.txt" | sort -k2 -nr | head -8

echo "== hottest functions (perf record -g, $N requests)"
perf record -g -o "$OUT/perf.data" -p $GW 2>/dev/null & REC=$!
sleep 0.2
load "$N" >/dev/null
kill -INT $REC; wait $REC 2>/dev/null || true
perf report -i "$OUT/perf.data" --no-children --stdio --percent-limit 1 2>/dev/null |
  grep -E "^ +[0-9.]+%" | head -25
