#!/usr/bin/env bash
# The gateway's start and reload at the largest config issue 36 names: MODELS model groups
# (default 10,000), each one deployment with rpm and tpm, and PRIORITIES reserved priorities
# (default 20), on the embedded store.
#
#   benches/start.sh [models, default 10000] [priorities, default 20] [runs, default 3]
#
# Per run: the time from starting the process to /health/liveliness answering (polled every
# 10 ms) and the gateway's RSS then; then every limit changed in the file and `POST
# /config/reload` timed (the counters reloaded in place: same models and priorities), and the RSS
# after. GATEWAY_BIN=path measures that build instead of this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${1:-10000}
PRIORITIES=${2:-20}
RUNS=${3:-3}
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch

config() { # RPM
  python3 - "$MODELS" "$PRIORITIES" "$1" <<'PY'
import sys
models, priorities, rpm = (int(a) for a in sys.argv[1:])
print("model_list:")
for i in range(models):
    print(f"  - model_name: m{i}")
    print(f"    litellm_params: {{model: openai/m{i}, api_base: 'http://127.0.0.1:9/v1', "
          f"rpm: {rpm}, tpm: {rpm * 1000}}}")
share = 0.9 / priorities
reserved = ", ".join(f"p{i}: {share:.6f}" for i in range(priorities))
print("litellm_settings:")
print("  callbacks: [\"dynamic_rate_limiter_v3\"]")
print(f"  priority_reservation: {{{reserved}}}")
print("  priority_reservation_settings: {default_priority: 0.1, saturation_threshold: 0.5}")
print("general_settings:")
print("  master_key: sk-load-master")
PY
}

ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
rss_mib() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

PORT=$(free_port)
for run in $(seq "$RUNS"); do
  config 1000 > "$TMP/config.yaml"
  rm -rf "$TMP/data"
  start=$(date +%s%N)
  RUST_LOG=error "${GATEWAY_BIN:-$BIN/gateway-example}" --config "$TMP/config.yaml" \
    --host 127.0.0.1 --port "$PORT" --data-dir "$TMP/data" >/dev/null &
  pid=$!
  until curl -s -o /dev/null "http://127.0.0.1:$PORT/health/liveliness"; do
    kill -0 "$pid" 2>/dev/null || { echo "the gateway exited" >&2; exit 1; }
    sleep 0.01
  done
  up=$(ms_since "$start")
  rss_up=$(rss_mib "$pid")
  config 2000 > "$TMP/config.yaml"
  start=$(date +%s%N)
  answer=$(curl -s -X POST "http://127.0.0.1:$PORT/config/reload" \
    -H 'authorization: Bearer sk-load-master')
  reload=$(ms_since "$start")
  case "$answer" in *'"limits_changed":true'*) ;; *) echo "reload: $answer" >&2; exit 1 ;; esac
  echo "run $run: $MODELS models x $PRIORITIES priorities: up in $up ms (RSS $rss_up MiB);" \
    "reloaded with every limit changed in $reload ms (RSS $(rss_mib "$pid") MiB)"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
