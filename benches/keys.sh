#!/usr/bin/env bash
# The embedded key store at scale: /key/generate latency, and chat latency with a generated key
# while keys are being generated, with N keys already stored (default 100,000).
#
#   [OLD_BIN=path/to/an/older/gateway-example] [POSTGRES=1] benches/keys.sh [keys, default 100000] [seconds per run, default 10]
#
# The N keys are seeded, not made through the API (100,000 calls on the old file store would take
# hours): a keys.json of N random records (the format of the file store, which the SQLite store
# imports once at its first start) is written by the script and copied into each gateway's data
# dir. So the same keys are measured on both stores, and the import time is measured too.
#
# For each binary (this tree's, release build; and OLD_BIN if given, e.g. one built from a commit
# before the SQLite store: `mkdir /tmp/old && git archive fb835cb | tar -x -C /tmp/old && cargo
# build --release -p gateway-example --manifest-path /tmp/old/Cargo.toml`, then
# OLD_BIN=/tmp/old/target/release/gateway-example):
#   1. start on the seeded data dir; time until /health/liveliness answers (includes the import);
#   2. chat alone: oha at a fixed 100 requests/s for SECS, one generated key, mock_response;
#   3. the same chat load while a second oha calls /key/generate back to back (one at a time)
#      for the same SECS: the generate latencies and the chat latencies under it;
#   4. (SQLite store) restart on the same data dir: time to open N+ keys from keys.db.
# With POSTGRES=1, the same runs on keys in Postgres (general_settings.database_url) follow: a
# fresh cluster (initdb from PATH or /usr/lib/postgresql/*/bin, as nobody under root, fsync on)
# whose LiteLLM tables are seeded with the same number of keys in SQL, brought over with
# `import-litellm` (timed), then the gateway started on it (time to read them all).
# The gateway runs on CPU $GW_CPU, the two ohas on CPU $OHA_CPU. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
N=${1:-100000}
SECS=${2:-10}
RATE=${RATE:-100}
GW_CPU=${GW_CPU:-1}
OHA_CPU=${OHA_CPU:-0}
need_oha
cargo build --release -q -p gateway-example
NEW_BIN=${CARGO_TARGET_DIR:-target}/release/gateway-example
scratch

cat > "$TMP/gw.yaml" <<'YAML'
model_list:
  - model_name: m
    litellm_params: {model: openai/m, mock_response: "hello from the key bench"}
# The seeded keys' and teams' priorities must be configured ones (an unknown one is a 400).
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {"prod": 0.5, "dev": 0.3, "batch": 0.2}
general_settings:
  master_key: sk-bench-master
YAML

# N records, three teams, in the file store's format.
python3 - "$N" > "$TMP/keys.json" <<'PY'
import json, os, sys
n = int(sys.argv[1])
teams = {f"team-{i}": {"team_id": f"team-{i}", "team_alias": f"team {i}",
                       "metadata": {"priority": p}, "created_at": 1700000000}
         for i, p in enumerate(["prod", "dev", "batch"])}
keys = {}
for i in range(n):
    token = os.urandom(32).hex()
    keys[token] = {"token": token, "key_alias": f"seeded-{i}", "metadata": {"priority": "dev"},
                   "team_id": f"team-{i % 3}" if i % 2 else None, "models": [],
                   "created_at": 1700000000 + i}
json.dump({"keys": keys, "teams": teams}, sys.stdout, indent=2)
PY
echo "seeded keys.json: $N keys, $(du -m "$TMP/keys.json" | cut -f1) MB; oha -q $RATE for chat, -c 1 for /key/generate, ${SECS}s each"

PORT=$(free_port)
start() { # $1 = binary, $2 = data dir: starts it (GW_PID), STARTED = seconds until it answers
  local t0
  t0=$(date +%s.%N)
  RUST_LOG=error taskset -c "$GW_CPU" "$1" --config "$TMP/gw.yaml" --host 127.0.0.1 --port $PORT \
    --data-dir "$2" > "$TMP/gw.log" 2>&1 &
  GW_PID=$!
  for _ in $(seq 1200); do curl -sf "http://127.0.0.1:$PORT/health/liveliness" >/dev/null && break; sleep 0.05; done
  STARTED=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')")
}
stop() { kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true; }

chat() { # $1 = key, $2 = output file
  taskset -c "$OHA_CPU" oha --no-tui -z "${SECS}s" -q "$RATE" -c 8 -m POST -T application/json \
    -H "authorization: Bearer $1" -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' \
    --output-format json "http://127.0.0.1:$PORT/v1/chat/completions" > "$2"
}
generate() { # $1 = output file
  taskset -c "$OHA_CPU" oha --no-tui -z "${SECS}s" -c 1 -m POST -T application/json \
    -H "authorization: Bearer sk-bench-master" -d '{"key_alias":"bench","metadata":{"priority":"prod"}}' \
    --output-format json "http://127.0.0.1:$PORT/key/generate" > "$1"
}

run() { # $1 = name, $2 = binary
  local data="$TMP/$1-data" key
  mkdir -p "$data"
  cp "$TMP/keys.json" "$data/keys.json"
  start "$2" "$data"
  echo "$1: first start (with $N keys) answered after $STARTED s"
  key=$(curl -sf "http://127.0.0.1:$PORT/key/generate" -H 'authorization: Bearer sk-bench-master' \
        -d '{"metadata": {"priority": "prod"}}' | sed -E 's/.*"key":"([^"]+)".*/\1/')
  chat "$key" "$TMP/$1-chat-alone.json"
  chat "$key" "$TMP/$1-chat-busy.json" &
  local chat_pid=$!
  generate "$TMP/$1-generate.json"
  wait $chat_pid
  stop
  if [ -f "$data/keys.db" ]; then
    start "$2" "$data"
    echo "$1: restart (opening keys.db) answered after $STARTED s; data dir: $(ls "$data" | tr '\n' ' ')"
    stop
  fi
}

run new "$NEW_BIN"
[ -n "${OLD_BIN:-}" ] && run old "$OLD_BIN"

if [ "${POSTGRES:-0}" = 1 ]; then
  PGBIN=$(dirname "$(readlink -f "$(command -v postgres 2>/dev/null || find /usr/lib/postgresql -path '*/bin/postgres' | sort -V | tail -1)")")
  AS=""
  if [ "$(id -u)" = 0 ]; then AS="setpriv --reuid=nobody --regid=nogroup --clear-groups"; chown nobody "$TMP"; fi
  $AS "$PGBIN/initdb" -D "$TMP/pg" -U postgres --auth=trust -E UTF8 > "$TMP/initdb.log"
  PGPORT=4182
  $AS "$PGBIN/postgres" -D "$TMP/pg" -p $PGPORT -k "$TMP" -c listen_addresses=127.0.0.1 > "$TMP/pg.log" 2>&1 &
  for _ in $(seq 200); do grep -q "ready to accept connections" "$TMP/pg.log" && break; sleep 0.05; done
  DB="postgres://postgres@127.0.0.1:$PGPORT/postgres"
  "$PGBIN/psql" -q "$DB" -f tests/src/litellm_tables.sql
  "$PGBIN/psql" -q "$DB" -c "
    INSERT INTO \"LiteLLM_TeamTable\" (team_id, team_alias, admins, members, metadata, models)
      SELECT 'team-' || i, 'team ' || i, '{}', '{}', jsonb_build_object('priority', p), '{}'
      FROM (VALUES (0, 'prod'), (1, 'dev'), (2, 'batch')) AS t (i, p);
    INSERT INTO \"LiteLLM_VerificationToken\" (token, key_alias, models, metadata, team_id)
      SELECT encode(sha256(('sk-seeded-' || i)::bytea), 'hex'), 'seeded-' || i, '{}',
             '{\"priority\": \"dev\"}', CASE WHEN i % 2 = 1 THEN 'team-' || (i % 3) END
      FROM generate_series(0, $N - 1) AS i;"
  t0=$(date +%s.%N)
  "$NEW_BIN" import-litellm --database-url "$DB" | grep '^read ' 
  echo "postgres: import-litellm of $N keys took $(python3 -c "print(f'{$(date +%s.%N) - $t0:.2f}')") s"
  printf 'general_settings:\n  master_key: sk-bench-master\n  database_url: "%s"\n' "$DB" > "$TMP/pg.yaml"
  grep -v -e '^general_settings:' -e 'master_key:' "$TMP/gw.yaml" >> "$TMP/pg.yaml"
  cp "$TMP/gw.yaml" "$TMP/gw-embedded.yaml"
  cp "$TMP/pg.yaml" "$TMP/gw.yaml"
  mkdir -p "$TMP/postgres-data"
  start "$NEW_BIN" "$TMP/postgres-data"
  echo "postgres: start (reading $N keys from Postgres) answered after $STARTED s"
  key=$(curl -sf "http://127.0.0.1:$PORT/key/generate" -H 'authorization: Bearer sk-bench-master' \
        -d '{"metadata": {"priority": "prod"}}' | sed -E 's/.*"key":"([^"]+)".*/\1/')
  chat "$key" "$TMP/postgres-chat-alone.json"
  chat "$key" "$TMP/postgres-chat-busy.json" &
  chat_pid=$!
  generate "$TMP/postgres-generate.json"
  wait $chat_pid
  stop
  cp "$TMP/gw-embedded.yaml" "$TMP/gw.yaml"
fi

python3 - "$TMP" <<'PY'
import json, os, sys
d = sys.argv[1]
def row(name, what, f):
    r = json.load(open(f))
    s, p = r["summary"], r["latencyPercentiles"]
    codes = r.get("statusCodeDistribution", {})
    n = sum(codes.values())
    print(f"| {name} | {what} | {n} | {codes.get('200', 0)} | {p['p50']*1000:.2f} | {p['p99']*1000:.2f} | {s['slowest']*1000:.1f} |")
print("| store | run | requests | 200s | p50 ms | p99 ms | max ms |")
print("|---|---|---:|---:|---:|---:|---:|")
for name in ("old", "new", "postgres"):
    if not os.path.exists(f"{d}/{name}-generate.json"):
        continue
    label = {"old": "file (keys.json)", "new": "SQLite (keys.db)", "postgres": "Postgres (database_url)"}[name]
    row(label, "/key/generate, back to back", f"{d}/{name}-generate.json")
    row(label, "chat alone", f"{d}/{name}-chat-alone.json")
    row(label, "chat while generating", f"{d}/{name}-chat-busy.json")
PY
