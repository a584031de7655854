#!/usr/bin/env bash
# `sim replay` on a synthetic record (benches/replay_trace.py: HOURS of Poisson arrivals at RATE a
# second, 30 keys, three callers' kinds), against benches/data/replay/candidate.yaml beside
# current.yaml, with the team limit of callers.json. Prints the table and the time the replay of
# both configs took (stderr); writes the plot to $SVG (default docs/replay-example.svg).
#
#   benches/replay.sh [hours] [rate] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/common.sh
HOURS=${1:-1}
RATE=${2:-15}
SEED=${3:-1}
SVG=${SVG:-$PWD/docs/replay-example.svg}
scratch
TRACE=$TMP/trace.jsonl
python3 benches/replay_trace.py "$HOURS" "$RATE" "$SEED" > "$TRACE"
PROFILE=${PROFILE:-release}
cargo build --profile "$PROFILE" -p sim
BIN=target/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/sim
cd benches/data/replay
/usr/bin/time -f "%e s wall, %U s user" "../../../$BIN" replay "$TRACE" \
  --config candidate.yaml --against current.yaml --callers callers.json --svg "$SVG"
