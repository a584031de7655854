#!/usr/bin/env bash
# Soak: the gateway, limiter on, proxying to `mock-upstream` for SOAK_SECS (default 600) at a fixed
# rate of mixed streamed, non-streamed and abandoned requests; its RSS and open files sampled every
# SAMPLE_SECS (default 10) into a CSV.
#
#   [SOAK_SECS=600] [RATE_JSON=150] [RATE_STREAM=150] [RATE_ABANDON=40] [OUT=dir] benches/soak.sh
#
# - non-streamed and streamed: oha at a fixed rate each (`-q`), two keys (priorities prod, dev);
# - abandoned: a small asyncio client at a fixed rate that sends a streamed request and hangs up
#   at a random point: before any answer (the gateway is waiting on the upstream), after the
#   status line, or after the first bytes of the stream;
# - the upstream answers after a uniform 20-200 ms, so requests overlap and abandonment lands
#   while the gateway holds a reservation and an upstream connection.
#
# The model's limits are far above what the run sends (nothing is refused for rate): the soak
# looks for growth (memory, file handles, in-flight counts) and errors, not for limiting. At the
# end it prints the samples' start / peak / end, every client's status codes, and checks that the
# gateway still answers. Everything listens on loopback, on free ports. The CSV and the oha
# reports stay in OUT (default: a temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
SOAK_SECS=${SOAK_SECS:-600}
SAMPLE_SECS=${SAMPLE_SECS:-10}
RATE_JSON=${RATE_JSON:-150}
RATE_STREAM=${RATE_STREAM:-150}
RATE_ABANDON=${RATE_ABANDON:-40}
need_oha
cargo build --release -q -p gateway-example -p mock-upstream
GW=${CARGO_TARGET_DIR:-target}/release/gateway-example
MOCK=${CARGO_TARGET_DIR:-target}/release/mock-upstream
scratch "${OUT:-}"
MOCK_PORT=$(free_port)
GW_PORT=$(free_port)
BASE=http://127.0.0.1:$GW_PORT
MASTER=sk-soak-master

RUST_LOG=error "$MOCK" --port "$MOCK_PORT" --latency uniform --latency-ms 20 --latency-max-ms 200 \
  > "$TMP/mock.out" 2> "$TMP/mock.err" &
MOCK_PID=$!
cat > "$TMP/gw.yaml" <<YAML
model_list:
  - model_name: soak-model
    litellm_params:
      model: openai/mock-model
      api_base: "http://127.0.0.1:$MOCK_PORT/v1"
      api_key: sk-soak-upstream
      rpm: 1000000000
      tpm: 1000000000000
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {prod: 0.75, dev: 0.25}
  priority_reservation_settings: {default_priority: 0.5, saturation_threshold: 0.5}
general_settings:
  master_key: $MASTER
YAML
for _ in $(seq 100); do grep -q http "$TMP/mock.out" 2>/dev/null && break; sleep 0.1; done
RUST_LOG=warn "$GW" --config "$TMP/gw.yaml" --host 127.0.0.1 --port "$GW_PORT" --data-dir "$TMP/data" \
  2> "$TMP/gw.err" &
GW_PID=$!
wait_up "$BASE/health/liveliness"
key() { curl -sf "$BASE/key/generate" -H "authorization: Bearer $MASTER" -d "{\"metadata\": {\"priority\": \"$1\"}}" \
  | sed -E 's/.*"key":"([^"]+)".*/\1/'; }
KEY_PROD=$(key prod)
KEY_DEV=$(key dev)

sample() { # elapsed seconds, RSS kB, open fds
  local rss fds
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$GW_PID/status")
  fds=$(find "/proc/$GW_PID/fd" -mindepth 1 -maxdepth 1 | wc -l)
  echo "$1,$rss,$fds"
}
echo "elapsed_s,rss_kb,open_fds" > "$TMP/samples.csv"
sample 0 >> "$TMP/samples.csv"

echo "soak: ${SOAK_SECS}s; json ${RATE_JSON}/s, stream ${RATE_STREAM}/s (oha -q), abandoned ${RATE_ABANDON}/s;" \
     "gateway pid $GW_PID on :$GW_PORT, mock-upstream on :$MOCK_PORT; samples every ${SAMPLE_SECS}s in $TMP/samples.csv"
body() { echo "{\"model\":\"soak-model\",\"stream\":$1,\"stream_options\":{\"include_usage\":$1},\"messages\":[{\"role\":\"user\",\"content\":\"soak $2\"}]}"; }
oha --no-tui -z "${SOAK_SECS}s" -q "$RATE_JSON" -c 48 -m POST -T application/json -H "authorization: Bearer $KEY_PROD" \
  -d "$(body false json)" --output-format json "$BASE/v1/chat/completions" > "$TMP/json.json" &
OHA_JSON=$!
oha --no-tui -z "${SOAK_SECS}s" -q "$RATE_STREAM" -c 48 -m POST -T application/json -H "authorization: Bearer $KEY_DEV" \
  -d "$(body true stream)" --output-format json "$BASE/v1/chat/completions" > "$TMP/stream.json" &
OHA_STREAM=$!
python3 - "$GW_PORT" "$KEY_PROD" "$RATE_ABANDON" "$SOAK_SECS" > "$TMP/abandon.json" <<'PY' &
import asyncio, json, random, sys, time
port, key, rate, secs = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
body = json.dumps({"model": "soak-model", "stream": True, "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": "abandoned"}]}).encode()
request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\n"
           f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
counts = {}
rng = random.Random(7)
async def one(when):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        if when == "before_answer":  # the upstream takes 20-200 ms: hang up while the gateway waits
            await asyncio.sleep(rng.uniform(0.0, 0.02))
        elif when == "after_status":
            await asyncio.wait_for(reader.readline(), 5)
        else:  # after the first bytes of the stream
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            await asyncio.wait_for(reader.read(64), 5)
        writer.transport.abort()  # RST, no goodbye
        outcome = when
    except Exception as e:
        outcome = f"error:{type(e).__name__}"
    counts[outcome] = counts.get(outcome, 0) + 1
async def main():
    start, n, tasks = time.monotonic(), 0, set()
    while time.monotonic() - start < secs:
        target = start + n / rate
        await asyncio.sleep(max(0.0, target - time.monotonic()))
        t = asyncio.create_task(one(rng.choice(["before_answer", "after_status", "mid_stream"])))
        tasks.add(t); t.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    print(json.dumps({"sent": n, "outcomes": counts}))
asyncio.run(main())
PY
ABANDON=$!

START=$(date +%s)
while kill -0 $OHA_JSON 2>/dev/null || kill -0 $OHA_STREAM 2>/dev/null || kill -0 $ABANDON 2>/dev/null; do
  sleep "$SAMPLE_SECS"
  sample $(($(date +%s) - START)) >> "$TMP/samples.csv"
done
wait $OHA_JSON $OHA_STREAM $ABANDON
sleep 2
sample $(($(date +%s) - START)) >> "$TMP/samples.csv"
AFTER=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/chat/completions" -H "authorization: Bearer $KEY_PROD" \
  -H 'content-type: application/json' -d "$(body false after)")
echo "a request after the soak: $AFTER"
echo "mock-upstream stats: $(curl -s "http://127.0.0.1:$MOCK_PORT/stats")"

python3 - "$TMP" <<'PY'
import csv, json, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(f"{d}/samples.csv")))
for col, unit in (("rss_kb", "MiB"), ("open_fds", "")):
    v = [int(r[col]) for r in rows]
    f = (lambda x: f"{x / 1024:.1f} MiB") if unit else str
    print(f"{col:>9}: start {f(v[0])}, peak {f(max(v))} (at {rows[v.index(max(v))]['elapsed_s']} s), end {f(v[-1])}")
for name in ("json", "stream"):
    r = json.load(open(f"{d}/{name}.json"))
    s, p = r["summary"], r["latencyPercentiles"]
    codes = r.get("statusCodeDistribution", {})
    errors = r.get("errorDistribution", {})
    print(f"{name:>9}: {sum(codes.values())} answered, {s['requestsPerSec']:.1f}/s, codes {codes}, errors {errors}, "
          f"p50 {p['p50'] * 1000:.1f} ms, p99 {p['p99'] * 1000:.1f} ms")
a = json.load(open(f"{d}/abandon.json"))
print(f"abandoned: {a['sent']} sent, {a['outcomes']}")
PY
echo "gateway log lines at warn or above: $(wc -l < "$TMP/gw.err")"
