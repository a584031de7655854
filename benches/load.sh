#!/usr/bin/env bash
# HTTP load on the gateway with oha: limiter on vs. off (`callbacks: []`), streaming and not;
# with COMPARE=metrics, both run the limiter and "off" is `general_settings.metrics: false`.
#
#   [COMPARE=limiter|metrics] [CONFIG=quickstart|full] [ENDPOINT=chat|embeddings|completions|responses|messages] \
#     benches/load.sh [seconds per run, default 8] [concurrency, default 64] [rounds, default 3]
#
# ENDPOINT (default chat, i.e. /v1/chat/completions) picks the endpoint loaded, with a body of its
# format; the mock_response deployment answers each in its own (embeddings never stream).
# Builds the gateway in release mode and starts two instances, one with the limiter and one
# without, serving mock_response deployments with limits far above what the run can send (nothing
# is refused, both do the same work). CONFIG=quickstart (the default, as issue 3 asks) is the
# quick-start config (gateway-example/config/quickstart.yaml) with its tpm raised and its
# priority reservations removed (one model, tpm only: 6 rate-limit headers per response, as the
# figures in benches/RESULTS.md were measured); CONFIG=full adds rpm and two priorities, so every
# admitted response carries all 15 rate-limit headers (docs/behaviour.md, the worst case). Runs alternate on/off so machine noise hits both alike; the
# ratio is taken between medians. Only loopback addresses are used. Installs oha when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-8}
CONC=${2:-64}
ROUNDS=${3:-3}
# The gateway and oha each get their own core, so the figures measure the gateway, not the load
# generator parsing the limiter's 15 response headers on the same core.
GW_CPU=${GW_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
command -v oha >/dev/null || cargo install --locked oha
cargo build --release -q -p gateway-example
BIN=${CARGO_TARGET_DIR:-target}/release/gateway-example
# shellcheck source=benches/common.sh
. benches/common.sh
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT

CONFIG=${CONFIG:-quickstart}
config() { # $1 = callbacks list
  if [ "$CONFIG" = full ]; then
    full_config 'mock_response: "hello from the load test"' "$1"
  else
    sed -e 's/tpm: 60$/tpm: 1000000000000/' -e "s/callbacks: .*/callbacks: $1/" \
      -e '/^  # Once the model is half used/d' -e '/^  priority_reservation:/,/^    saturation_threshold:/d' \
      -e 's/my-fake-model/load-model/g' -e 's/sk-1234.*/sk-load-master/' gateway-example/config/quickstart.yaml
  fi
}

declare -A PORT=([on]=4101 [off]=4102) KEY PID
for mode in on off; do
  if [ "${COMPARE:-limiter}" = metrics ]; then
    config '["dynamic_rate_limiter_v3"]' > "$TMP/$mode.yaml"
    [ $mode = off ] && sed -i 's/^  master_key: sk-load-master$/&\n  metrics: false/' "$TMP/$mode.yaml"
  else
    [ $mode = on ] && cb='["dynamic_rate_limiter_v3"]' || cb='[]'
    config "$cb" > "$TMP/$mode.yaml"
  fi
  RUST_LOG=error taskset -c "$GW_CPU" "$BIN" --config "$TMP/$mode.yaml" --host 127.0.0.1 --port "${PORT[$mode]}" --data-dir "$TMP/$mode-data" &
  PID[$mode]=$!
  wait_up "http://127.0.0.1:${PORT[$mode]}/health/liveliness"
  KEY[$mode]=$(prod_key "${PORT[$mode]}")
done

ENDPOINT=${ENDPOINT:-chat}
case "$ENDPOINT" in
  chat) path=chat/completions; fields='"messages":[{"role":"user","content":"hi"}]' ;;
  embeddings) path=embeddings; fields='"input":"hi"' ;;
  completions) path=completions; fields='"prompt":"hi"' ;;
  responses) path=responses; fields='"input":"hi"' ;;
  messages) path=messages; fields='"max_tokens":20,"messages":[{"role":"user","content":"hi"}]' ;;
  *) echo "ENDPOINT must be chat, embeddings, completions, responses or messages" >&2; exit 2 ;;
esac

echo "COMPARE=${COMPARE:-limiter} CONFIG=$CONFIG; ENDPOINT=$ENDPOINT (/v1/$path); oha -z ${SECS}s -c $CONC, $ROUNDS rounds; gateway pinned to CPU $GW_CPU, oha to CPU $OHA_CPU"
for round in $(seq "$ROUNDS"); do
  for stream in false true; do
    for mode in on off; do
      body="{\"model\":\"load-model\",\"stream\":$stream,$fields}"
      # The gateway's CPU time (user + system, clock ticks) around the run: CPU per request is
      # what machine noise (other processes on the gateway's core) disturbs least.
      before=$(cpu_ticks "${PID[$mode]}")
      taskset -c "$OHA_CPU" oha --no-tui -z "${SECS}s" -c "$CONC" -m POST -T application/json -H "authorization: Bearer ${KEY[$mode]}" \
          -d "$body" --output-format json "http://127.0.0.1:${PORT[$mode]}/v1/$path" > "$TMP/$mode-$stream-$round.json"
      echo $(( $(cpu_ticks "${PID[$mode]}") - before )) > "$TMP/$mode-$stream-$round.cpu"
    done
  done
done

python3 - "$TMP" "$ROUNDS" "$(getconf CLK_TCK)" "${COMPARE:-limiter}" <<'PY'
import json, statistics, sys
d, rounds, tick = sys.argv[1], int(sys.argv[2]), 1e6 / int(sys.argv[3])
label = "metrics" if len(sys.argv) > 4 and sys.argv[4] == "metrics" else "limiter"
for stream in ("false", "true"):
    med, cpu = {}, {}
    for mode in ("on", "off"):
        runs = [json.load(open(f"{d}/{mode}-{stream}-{r}.json")) for r in range(1, rounds + 1)]
        rps = [r["summary"]["requestsPerSec"] for r in runs]
        p50 = statistics.median(r["latencyPercentiles"]["p50"] * 1000 for r in runs)
        p99 = statistics.median(r["latencyPercentiles"]["p99"] * 1000 for r in runs)
        ok = all(set(r.get("statusCodeDistribution", {})) == {"200"} for r in runs)
        med[mode] = statistics.median(rps)
        # Gateway CPU microseconds per answered request, over all rounds.
        ticks = sum(int(open(f"{d}/{mode}-{stream}-{r}.cpu").read()) for r in range(1, rounds + 1))
        answered = sum(sum(r.get("statusCodeDistribution", {}).values()) for r in runs)
        cpu[mode] = ticks * tick / max(answered, 1)
        print(f"{mode:>3} stream={stream:<5} rps median={med[mode]:8.0f} (runs {', '.join(f'{x:.0f}' for x in rps)}) "
              f"p50={p50:5.2f}ms p99={p99:5.2f}ms cpu/request={cpu[mode]:6.1f}us all-200={ok}")
    print(f"    stream={stream:<5} {label} on / off = {med['on'] / med['off']:.3f} (throughput), "
          f"{cpu['off'] / cpu['on']:.3f} (off / on CPU per request)")
PY
