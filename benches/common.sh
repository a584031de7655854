# Shared by every bench script: sourced, not run.

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

# Sets TMP, a scratch directory (DIR when given, then kept), and at exit kills every background
# job of the script and removes TMP (unless it was given).
scratch() { # [DIR]
  if [ -n "${1:-}" ]; then
    mkdir -p "$1"
    TMP=$1
    trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  else
    TMP=$(mktemp -d)
    trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$TMP"' EXIT
  fi
}

# Builds the gateway's and mock-upstream's release binaries (not when GATEWAY_BIN names another build: the scripts
# that take one run it, and this tree's mock-upstream, as they are); sets BIN (their directory)
# and TMP ([`scratch`]).
build_and_scratch() {
  [ -n "${GATEWAY_BIN:-}" ] || cargo build --release -q -p gateway-example -p mock-upstream
  BIN=${CARGO_TARGET_DIR:-target}/release
  scratch
}

# oha, installed if missing.
need_oha() { command -v oha >/dev/null || cargo install --locked oha; }

# A free TCP port on 127.0.0.1 (the kernel's choice).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# CPU time of process PID so far, user + kernel, in clock ticks (10 ms here): read before and
# after a load, the difference per request is what machine noise disturbs least.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The same, user and kernel apart: "user kernel".
user_kernel_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# Context switches of process PID so far, its threads summed: "voluntary involuntary". Voluntary
# ones are waits (each a sleep and a wake-up), involuntary ones the kernel's preemptions.
context_switches() {
  local v=0 n=0 s
  for s in /proc/"$1"/task/*/status; do
    v=$((v + $(awk '/^voluntary_ctxt/{print $2}' "$s")))
    n=$((n + $(awk '/^nonvoluntary_ctxt/{print $2}' "$s")))
  done
  echo "$v $n"
}
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

# The targets of the proxy benches (proxy.sh, proxy_cpu.sh, proxy_ab.sh, proxy_profile.sh,
# rate_cpu.sh; proxy_callgrind.sh starts its own under valgrind), each on 127.0.0.1:PORT in front of
# the `mock-upstream` on 127.0.0.1:UP_PORT and pinned to CPU $PROXY_CPU with it. Each waits until
# its target answers and leaves its process id in PID_OF[PORT]. They need BIN and TMP
# (build_and_scratch) and the floor's binary (cargo build --release -p benches --example proxy_floor).
declare -A PID_OF
# mock-upstream with STREAM_CHUNKS (default 50) words to a stream.
start_upstream() { # PORT
  RUST_LOG=error taskset -c "$PROXY_CPU" "$BIN/mock-upstream" --port "$1" \
    --stream-chunks "${STREAM_CHUNKS:-50}" $(upstream_flags) >/dev/null 2>&1 &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/stats"
}
# nginx (Debian's package, installed when missing), one worker: proxy_pass to an upstream block
# with keepalive 64, limit_req at a rate far above any load, proxy_buffering off. Its process id is
# the master's; its worker is the master's child (nginx_worker).
start_nginx() { # PORT UP_PORT
  if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx >/dev/null
  fi
  local dir=$TMP/nginx-$1
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
daemon off;
user root;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  limit_req_zone \$binary_remote_addr zone=all:1m rate=100000000r/s;
  upstream mock { server 127.0.0.1:$2; keepalive 64; }
  server {
    listen 127.0.0.1:$1;
    location / {
      limit_req zone=all burst=100000 nodelay;
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
  taskset -c "$PROXY_CPU" "$(command -v nginx || echo /usr/sbin/nginx)" -c "$dir/nginx.conf" -e "$dir/error.log" &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/stats"
}
# The worker process of the nginx whose master is PID.
nginx_worker() { pgrep -P "$1" | head -1; }
# gateway-example (GATEWAY_BIN, default this tree's) with the full config: limiter on, every
# rate-limit header. Sets KEY to a `prod` key of it.
start_gateway() { # PORT UP_PORT
  full_config "api_base: \"http://127.0.0.1:$2/v1\"" '["dynamic_rate_limiter_v3"]' > "$TMP/gateway-$1.yaml"
  RUST_LOG=error taskset -c "$PROXY_CPU" "${GATEWAY_BIN:-$BIN/gateway-example}" --config "$TMP/gateway-$1.yaml" \
    --host 127.0.0.1 --port "$1" --data-dir "$TMP/gateway-data-$1" >/dev/null &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/health/liveliness"
  KEY=$(prod_key "$1")
}
# benches/examples/proxy_floor.rs, with hyper's server side or (own) the one written for the path.
start_floor() { # PORT UP_PORT [hyper|own]
  FLOOR_SERVER=${3:-hyper} taskset -c "$PROXY_CPU" "$BIN/examples/proxy_floor" "$1" \
    "http://127.0.0.1:$2/v1/chat/completions" &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/stats"
}
