# Shared by the HTTP load scripts (load.sh, proxy.sh, proxy_ab.sh, proxy_callgrind.sh,
# proxy_profile.sh, rate_cpu.sh): sourced, not run.

# The "full" gateway config: model `load-model` with rpm and tpm far above any run, two
# priorities, so every admitted response carries all 15 rate-limit headers.
#   full_config DEPLOYMENT_PARAMS CALLBACKS
# DEPLOYMENT_PARAMS goes into litellm_params after `model` (e.g. `mock_response: "hi"` or
# `api_base: "http://127.0.0.1:9001/v1"`); CALLBACKS is a YAML list.
full_config() {
  cat <<YAML
model_list:
  - model_name: load-model
    litellm_params: {model: openai/load-model, $1, rpm: 1000000000, tpm: 1000000000000}
litellm_settings:
  callbacks: $2
  priority_reservation: {prod: 0.9, dev: 0.1}
  priority_reservation_settings: {default_priority: 0.25, saturation_threshold: 0.5}
general_settings:
  master_key: sk-load-master
YAML
}

# Waits (up to 30 s) until URL answers, else exits.
wait_up() {
  for _ in $(seq 300); do curl -s -o /dev/null "$1" && return; sleep 0.1; done
  echo "$1 did not come up" >&2
  exit 1
}

# A new `prod` key from the gateway on 127.0.0.1:PORT (master key sk-load-master).
prod_key() {
  curl -sf "http://127.0.0.1:$1/key/generate" -H 'authorization: Bearer sk-load-master' \
    -d '{"metadata": {"priority": "prod"}}' | sed -E 's/.*"key":"([^"]+)".*/\1/'
}

# Builds the gateway's release binaries; sets BIN (their directory) and TMP (a scratch directory,
# removed at exit, when every background job of the script is killed too).
build_and_scratch() {
  cargo build --release -q -p gateway-example --bins
  BIN=${CARGO_TARGET_DIR:-target}/release
  TMP=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
}

# CPU time of process PID so far, user + kernel, in clock ticks (10 ms here): read before and
# after a load, the difference per request is what machine noise disturbs least.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The user message of a load's requests: "hi", or $PROMPT_BYTES bytes of words when set (what a
# prompt's size costs: the body is read, estimated and edited on its way upstream).
prompt_text() {
  if [ -n "${PROMPT_BYTES:-}" ]; then
    python3 -c "import sys; n = int(sys.argv[1]); print(('the quick brown fox jumps over the lazy dog ' * (n // 44 + 1))[:n])" "$PROMPT_BYTES"
  else
    echo hi
  fi
}
# The mock upstream's flags for what it sends besides its answer: with PROVIDER_HEADERS=1, the
# other headers OpenAI sends on an answer (a real head's size).
upstream_flags() {
  if [ "${PROVIDER_HEADERS:-}" = 1 ]; then echo --provider-headers; fi
}
