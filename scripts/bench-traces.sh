#!/usr/bin/env bash
# Traces out, measured (docs/performance.md "Traces out"): the same release binary with export
# off (A) against export on to a loopback OTLP sink (B), then off (A) against a collector that
# is down (B: nothing listens at the endpoint). Runs scripts/bench-ab.sh for each pair, so the
# figures are server CPU per delivery and the generator's latency percentiles, pinned cores.
#
#   cargo build --release && cargo bench --bench load --no-run
#   scripts/bench-traces.sh LOAD_BIN target/release/map-router [ROUNDS] > results.jsonl
#
# Every line is bench-ab.sh's, with "pair": "on" or "down" added. Then the latency of sends at
# a fixed rate (RATE msg/s, default 2700, 10 agents + 2 subscribers, 1 publisher), export off,
# on and down in turn, ROUNDS times: lines with "pair": "rate" and "export": off|on|down.
# Loopback only; every wait is bounded.
set -euo pipefail
LOAD=$1; BIN=$2; ROUNDS=${3:-3}
dir=$(mktemp -d)
trap 'kill "${sink:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/otlp-sink.py" "$dir/port" 2> "$dir/sink.log" &
sink=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
port=$(cat "$dir/port")
printf '[telemetry]\nendpoint = "http://127.0.0.1:%s"\n' "$port" > "$dir/on.toml"
# A port nothing listens on: bind and release one.
down=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf '[telemetry]\nendpoint = "http://127.0.0.1:%s"\n' "$down" > "$dir/down.toml"
here=$(dirname "$0")
B_ARGS="--config $dir/on.toml" "$here/bench-ab.sh" "$LOAD" "$BIN" "$BIN" "$ROUNDS" \
  | sed 's/^{/{"pair":"on",/'
B_ARGS="--config $dir/down.toml" "$here/bench-ab.sh" "$LOAD" "$BIN" "$BIN" "$ROUNDS" \
  | sed 's/^{/{"pair":"down",/'
. "$here/lib.sh"
for round in $(seq "$ROUNDS"); do
  for export in off on down; do
    args=(); [ "$export" != off ] && args=(--config "$dir/$export.toml")
    : > "$dir/log"
    taskset -c 0 "$BIN" serve --listen 127.0.0.1:0 --ephemeral "${args[@]}" 2> "$dir/log" &
    pid=$!
    url=$(router_url "$dir/log")
    c0=$(cpu "$pid")
    res=$(taskset -c 1 timeout 300 "$LOAD" --url "$url" --server-pid "$pid" --test fanout \
      --agents 10 --subscribers 2 --publishers 1 --messages 20000 --rate "${RATE:-2700}" \
      --payload-bytes 1024 2>/dev/null | grep deliveries_per_s | head -n1)
    c1=$(cpu "$pid")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "{\"pair\":\"rate\",\"round\":$round,\"export\":\"$export\",\"cpu_ticks\":$((c1 - c0)),\"result\":$res}"
  done
done
kill -TERM "$sink"; wait "$sink" 2>/dev/null || true
cat "$dir/sink.log" >&2
