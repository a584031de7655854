#!/usr/bin/env bash
# What one proxied request costs the gateway, counted rather than timed (so a busy machine does
# not move it): instructions (valgrind's callgrind) and heap allocations (calls into the global
# allocator: jemalloc in the gateway and in the floor, from the same callgrind run) per
# request, non-streamed or streamed. Counted at the allocator's entry points, not at Rust's
# `__rust_alloc`: the compiler inlines that shim into some callers, whose allocations it would
# then miss.
#
#   benches/proxy_callgrind.sh [stream: false|true, default false] [requests, default 2000]
#
# The gateway (limiter on, two priorities, rpm and tpm: every rate-limit header; the setup of
# benches/proxy.sh) runs under callgrind with instrumentation off until 200 warm-up requests are
# done; `mock-upstream --stream-chunks 50` runs natively. Only the gateway's own process is
# counted, user space only (the kernel's networking is not). A counting global allocator in a
# bench binary is not possible here: the workspace forbids `unsafe` code.
# TARGET=mock counts the gateway answering from its own `mock_response` instead (no upstream), and
# CALLBACKS='[]' with the limiter off: the two together give what the limiter costs per request.
# TARGET=floor counts benches/examples/proxy_floor.rs instead: the gateway's server settings and
# upstream client with nothing else (what the stack costs; the gateway's own work is the rest).
# With FLOOR_SERVER=own as well, the floor's server side is the one written for the path, not
# hyper's (benches/examples/proxy_floor.rs): what hyper's server side costs is the difference.
# GATEWAY_BIN=path counts that gateway binary instead of this tree's (nothing is built then: e.g.
# a build from before a change).
# KEEP_PROFILE=path keeps the callgrind output there, for `callgrind_annotate --inclusive=yes path`.
# PROMPT_BYTES=N makes the user message N bytes of words (default: "hi"), for what a prompt's
# size costs (the body is read, estimated and edited on its way upstream). PROVIDER_HEADERS=1 has
# the mock send the other headers OpenAI sends on an answer (14 of them), for what reading a real
# answer's head costs. RECORD=1 turns the request record on (`general_settings.record`, every
# request): what it costs per request, its writer thread included (the count waits for the
# writer to drain before it is read).
set -euo pipefail
cd "$(dirname "$0")/.."
STREAM=${1:-false}
N=${2:-2000}
command -v valgrind >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null
command -v oha >/dev/null || cargo install --locked oha
# shellcheck source=benches/common.sh
. benches/common.sh
build_and_scratch
UP_PORT=4211 GW_PORT=4212

"$BIN/mock-upstream" --port "$UP_PORT" --stream-chunks 50 $(upstream_flags) >/dev/null 2>&1 &
if [ "${TARGET:-upstream}" = mock ]; then
  params='mock_response: "hi"'
else
  params="api_base: \"http://127.0.0.1:$UP_PORT/v1\""
fi
full_config "$params" "${CALLBACKS:-[\"dynamic_rate_limiter_v3\"]}" > "$TMP/gateway.yaml"
[ -n "${RECORD:-}" ] && echo "  record: {path: $TMP/record.jsonl}" >> "$TMP/gateway.yaml"
if [ "${TARGET:-upstream}" = floor ]; then
  cargo build --release -q -p benches --example proxy_floor
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/callgrind.%p" \
    "$BIN/examples/proxy_floor" "$GW_PORT" "http://127.0.0.1:$UP_PORT/v1/chat/completions" \
    >/dev/null 2>"$TMP/valgrind.log" &
  GW=$!
  wait_up "http://127.0.0.1:$GW_PORT/"
  KEY=none
else
  RUST_LOG=error valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/callgrind.%p" \
    "${GATEWAY_BIN:-$BIN/gateway-example}" --config "$TMP/gateway.yaml" --host 127.0.0.1 --port "$GW_PORT" \
    --data-dir "$TMP/data" >/dev/null 2>"$TMP/valgrind.log" &
  GW=$!
  wait_up "http://127.0.0.1:$GW_PORT/health/liveliness"
  KEY=$(prod_key "$GW_PORT")
fi
opts=''
[ "$STREAM" = true ] && opts=',"stream_options":{"include_usage":true}'
PROMPT=$(prompt_text)
BODY="{\"model\":\"load-model\",\"stream\":$STREAM$opts,\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}]}"
load() {
  oha --no-tui -n "$1" -c 16 -m POST -T application/json -H "authorization: Bearer $KEY" -d "$BODY" \
      "http://127.0.0.1:$GW_PORT/v1/chat/completions"
}
load 200 >/dev/null
callgrind_control -i on "$GW" >/dev/null 2>&1
load "$N" > "$TMP/oha.txt"
# The record's writer takes what is waiting every 50 ms: let it drain before counting.
[ -n "${RECORD:-}" ] && sleep 1
callgrind_control -d "$GW" >/dev/null 2>&1
[ -n "${KEEP_PROFILE:-}" ] && cp "$TMP"/callgrind.*.1 "$KEEP_PROFILE"
grep -q "\[200\] $N responses" "$TMP/oha.txt" || { echo "not every request answered 200:" >&2; cat "$TMP/oha.txt" >&2; exit 1; }

python3 - "$N" "$STREAM" "$TMP"/callgrind.*.1 <<'PY'
import re, sys
n, stream, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
instructions, allocs = 0, 0
for path in paths:
    names, current = {}, None
    for line in open(path, errors="replace"):
        if line.startswith("summary:") or line.startswith("totals:"):
            instructions = max(instructions, int(line.split()[1]))
        elif line.startswith(("fn=", "cfn=")):
            # Names are compressed: "(id) name" the first time (after fn= or cfn=), "(id)" later.
            m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.strip())
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                current = names.get(m.group(1), "") if line.startswith("cfn=") else None
        elif line.startswith("calls=") and current is not None:
            # mimalloc's (gateway builds with the `mimalloc` feature), then
            # jemalloc's (tikv-jemallocator's prefixed symbols: `mallocx` when the alignment is
            # above the size class's, else `malloc`).
            if current in ("mi_malloc_aligned", "mi_zalloc_aligned", "mi_realloc_aligned",
                           "_rjem_malloc", "_rjem_mallocx", "_rjem_calloc", "_rjem_realloc",
                           "_rjem_rallocx"):
                allocs += int(line.split("=")[1].split()[0])
            current = None
print(f"stream={stream}: {instructions / n:,.0f} instructions and {allocs / n:.1f} allocations "
      f"per request in the gateway's process ({n} requests, user space)")
PY
