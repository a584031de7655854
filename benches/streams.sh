#!/usr/bin/env bash
# Memory per open stream: N slow SSE streams at once through nginx and through the gateway, each
# in front of `mock-upstream` (EVENTS events GAP_MS apart), the proxy's resident memory (RSS) and
# open files sampled every second; then 30 s (AFTER_SECS) after the last stream ended, to see
# whether the memory comes back.
#
#   benches/streams.sh [N, default 5000]
#   [TARGETS="nginx gateway"] [EVENTS=30] [GAP_MS=2000] [RAMP=1000] [AFTER_SECS=30] [OUT=dir]
#   [GATEWAY_BIN=path] [MODE=streams|waiters] [PORT_BASE=4311: ports PORT_BASE..+2]
#
# Each target runs alone (one after the other), on a fresh process: baseline is its RSS after a
# warm-up of 20 streamed requests, peak the largest sample while the streams are open, "after"
# the sample AFTER_SECS after the client's last stream ended. Per stream = (peak - baseline) / the
# streams served (nginx cuts a few percent of them at 5,000 here, before their head: the client
# counts them apart).
# The client (Python asyncio, one connection a stream, opened at RAMP a second) checks that every
# stream ended with `[DONE]`. A proxy holds two files a stream (client, upstream): with the
# machine's hard limit of 20,000 files N stays below about 9,900.
#
# MODE=waiters measures queued requests instead (gateway only): the model has `rpm: 1` (the first
# request takes it), `priority_reservation_settings.queue` is on (max_queued N + 100,
# max_wait_seconds 120), and the N - 1 others wait in the queue (its depth is printed, from
# /metrics); per waiter = (peak - baseline) / N, its connection included (a waiter holds no
# upstream connection). The client hangs up on them HOLD_SECS (default 10) after the last was sent.
#
# ALLOCATOR_ENV="VAR=value ..." is put in the gateway's environment (e.g. allocator options).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-5000}
TARGETS=${TARGETS:-nginx gateway}
EVENTS=${EVENTS:-30}
GAP_MS=${GAP_MS:-2000}
RAMP=${RAMP:-1000}
AFTER_SECS=${AFTER_SECS:-30}
HOLD_SECS=${HOLD_SECS:-10}
MODE=${MODE:-streams}
ulimit -n "$(ulimit -Hn)"
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
UP_PORT=${PORT_BASE:-4311} PROXY_PORT=$((${PORT_BASE:-4311} + 1))
# A stream's events: role, EVENTS - 4 words, finish, usage, [DONE].
CHUNKS=$((EVENTS > 4 ? EVENTS - 4 : 1))

rss_kb() { # the sum over the pids given
  local total=0 p
  for p in "$@"; do total=$((total + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status"))); done
  echo "$total"
}
fds() { local total=0 p; for p in "$@"; do total=$((total + $(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 | wc -l))); done; echo "$total"; }

start_nginx_for() { # PORT UP_PORT N
  local dir=$TMP/nginx-$1
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
daemon off;
user root;
worker_processes 1;
worker_rlimit_nofile $(ulimit -Hn);
pid $dir/nginx.pid;
error_log $dir/error.log error;
events { worker_connections $((2 * $3 + 256)); }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  upstream mock { server 127.0.0.1:$2; keepalive 64; }
  upstream warm { server 127.0.0.1:$(($2 + 2)); keepalive 64; }
  server {
    listen 127.0.0.1:$1 backlog=4096;
    location / {
      if (\$http_x_warm_up) { proxy_pass http://warm; }
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
  "$(command -v nginx || echo /usr/sbin/nginx)" -c "$dir/nginx.conf" -e "$dir/error.log" &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/stats"
}

start_gateway_for() { # PORT UP_PORT N
  local queue=''
  local limits='rpm: 1000000000, tpm: 1000000000000'
  if [ "$MODE" = waiters ]; then
    queue=", queue: {max_wait_seconds: 120, max_queued: $(($3 + 100))}"
    limits='rpm: 1'
  fi
  cat > "$TMP/gateway-$1.yaml" <<YAML
model_list:
  - model_name: load-model
    litellm_params: {model: openai/load-model, api_base: "http://127.0.0.1:$2/v1", $limits}
  - model_name: warm-model
    litellm_params: {model: openai/load-model, api_base: "http://127.0.0.1:$(($2 + 2))/v1"}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {prod: 0.9, dev: 0.1}
  priority_reservation_settings: {default_priority: 0.25, saturation_threshold: 0.5$queue}
general_settings:
  master_key: sk-load-master
  max_connections: $(($3 + 1000))
YAML
  # shellcheck disable=SC2086
  env RUST_LOG=error ${ALLOCATOR_ENV:-} "${GATEWAY_BIN:-$BIN/gateway-example}" --config "$TMP/gateway-$1.yaml" \
    --host 127.0.0.1 --port "$1" --data-dir "$TMP/gateway-data-$1" >/dev/null &
  PID_OF[$1]=$!
  wait_up "http://127.0.0.1:$1/health/liveliness"
  KEY=$(prod_key "$1")
}

client() { # PORT N KEY WARMUP(0|1)
  python3 - "$@" <<'PY'
import asyncio, json, resource, sys, time
port, n, key, warmup = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
import os
ramp, mode, hold = float(os.environ["RAMP"]), os.environ["MODE"], float(os.environ["HOLD_SECS"])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
body = json.dumps({"model": "warm-model" if warmup else "load-model", "stream": True, "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
auth = (f"authorization: Bearer {key}\r\n" if key else "") + ("x-warm-up: 1\r\n" if warmup else "")
request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}"
           f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
done, failed, opened, statuses = 0, {}, 0, {}
all_open = asyncio.Event()
async def one():
    global done, opened
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        opened += 1
        if opened == n:
            all_open.set()
        if mode == "waiters" and not warmup:
            await stop.wait()
            writer.transport.abort()
            done += 1
            return
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        statuses[status] = statuses.get(status, 0) + 1
        tail = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                raise EOFError("closed before [DONE]")
            tail = (tail + chunk)[-64:]
            if b"[DONE]" in tail:
                break
        writer.close()
        done += 1
    except Exception as e:
        k = type(e).__name__
        failed[k] = failed.get(k, 0) + 1
async def main():
    global stop
    stop = asyncio.Event()
    start, tasks = time.monotonic(), []
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / ramp - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
    await all_open.wait()
    print(f"all {n} open after {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    if mode == "waiters" and not warmup:
        await asyncio.sleep(hold)
        stop.set()
    await asyncio.gather(*tasks)
    print(json.dumps({"n": n, "ended_with_done": done, "failed": failed, "statuses": statuses,
                      "secs": round(time.monotonic() - start, 1)}))
asyncio.run(main())
PY
}

export RAMP MODE HOLD_SECS
"$BIN/mock-upstream" --port "$UP_PORT" --stream-chunks "$CHUNKS" --stream-event-gap-ms "$GAP_MS" \
  >/dev/null 2>"$TMP/mock.err" &
wait_up "http://127.0.0.1:$UP_PORT/stats"
"$BIN/mock-upstream" --port $((UP_PORT + 2)) --stream-chunks "$CHUNKS" >/dev/null 2>&1 &
wait_up "http://127.0.0.1:$((UP_PORT + 2))/stats"
echo "streams.sh: N=$N mode=$MODE, $EVENTS events ${GAP_MS} ms apart, ramp $RAMP/s, after $AFTER_SECS s; $(date -u +%FT%TZ)"
for target in $TARGETS; do
  KEY=''
  case $target in
    nginx) start_nginx_for "$PROXY_PORT" "$UP_PORT" "$N"; pids="${PID_OF[$PROXY_PORT]} $(nginx_worker "${PID_OF[$PROXY_PORT]}")" ;;
    gateway) start_gateway_for "$PROXY_PORT" "$UP_PORT" "$N"; pids=${PID_OF[$PROXY_PORT]} ;;
    *) echo "unknown target $target" >&2; exit 1 ;;
  esac
  # Warm-up: 20 streams from a second, fast mock-upstream (model `warm-model`; for nginx, the
  # header x-warm-up), so the baseline has the runtime's threads and the first connections in it.
  MODE=streams RAMP=1000 client "$PROXY_PORT" 20 "$KEY" 1 > "$TMP/$target.warm.json" 2>&1
  sleep 1
  # shellcheck disable=SC2086
  base=$(rss_kb $pids) base_fds=$(fds $pids)
  csv=$TMP/$target.csv
  echo "elapsed_s,rss_kb,open_fds" > "$csv"
  client "$PROXY_PORT" "$N" "$KEY" 0 > "$TMP/$target.client.json" 2> "$TMP/$target.client.err" &
  CLIENT=$!
  t0=$(date +%s)
  depth_seen=''
  while kill -0 $CLIENT 2>/dev/null; do
    # Waiters: the queue's depth once every request was sent (it should be N - 1).
    if [ "$MODE" = waiters ] && [ -z "$depth_seen" ] && grep -q "all .* open" "$TMP/$target.client.err" 2>/dev/null; then
      depth_seen=$(curl -s "http://127.0.0.1:$PROXY_PORT/metrics" -H 'authorization: Bearer sk-load-master' \
        | awk '/^priority_limit_queue_depth/ {s += $2} END {print s + 0}')
      echo "  queue depth with every request sent: $depth_seen"
    fi
    # shellcheck disable=SC2086
    echo "$(($(date +%s) - t0)),$(rss_kb $pids),$(fds $pids)" >> "$csv"
    sleep 1
  done
  wait $CLIENT || true
  ended=$(($(date +%s) - t0))
  for s in $(seq "$AFTER_SECS"); do
    sleep 1
    # shellcheck disable=SC2086
    echo "$(($(date +%s) - t0)),$(rss_kb $pids),$(fds $pids)" >> "$csv"
  done
  # shellcheck disable=SC2086
  python3 - "$target" "$N" "$base" "$base_fds" "$ended" "$csv" "$TMP/$target.client.json" "$MODE" <<'PY'
import csv, json, sys
target, n, base, base_fds, ended, path, client, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7], sys.argv[8]
rows = [(int(r["elapsed_s"]), int(r["rss_kb"]), int(r["open_fds"])) for r in csv.DictReader(open(path))]
peak = max(rows, key=lambda r: r[1])
after = rows[-1]
c = json.load(open(client))
unit = "waiter" if mode == "waiters" else "stream"
# Per stream served: a stream that failed (its connection refused or cut) held little or nothing.
served = n if mode == "waiters" else max(1, c["ended_with_done"])
print(f"{target:>8}: baseline {base / 1024:.1f} MiB ({base_fds} files), peak {peak[1] / 1024:.1f} MiB at {peak[0]} s "
      f"(files {max(r[2] for r in rows)}), {(peak[1] - base) * 1024 / served / 1000:.1f} kB per {unit} "
      f"({served} of {n} {unit}s served); "
      f"after: {after[1] / 1024:.1f} MiB {after[0] - ended} s after the end ({after[1] / base:.2f} x baseline, "
      f"{after[2]} files); client: {c}")
PY
  [ -n "${OUT:-}" ] && cp "$csv" "$TMP/$target.client.json" "$OUT/" && { [ "$target" != nginx ] || cp "$TMP/nginx-$PROXY_PORT/error.log" "$OUT/nginx-error.log"; }
  kill "${PID_OF[$PROXY_PORT]}" 2>/dev/null || true
  wait "${PID_OF[$PROXY_PORT]}" 2>/dev/null || true
  sleep 1
done
