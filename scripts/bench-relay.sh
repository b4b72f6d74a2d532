#!/usr/bin/env bash
# The cost of a call a standby relays to the live node (cluster mode, docs/cluster.md): the
# load generator's `rtt` case (map/agents/list, one connection at a time and 8 at once) against
# the live node itself and against a standby, which forwards each call over its relay session
# (NATS both ways). Alternating, ROUNDS times. The live node is pinned to core 0; nats-server,
# the standby and the generator share core 1. Prints one JSON line per run: the target, the
# live node's, the standby's and nats-server's CPU ticks (100 per second) and the generator's
# two result lines.
#
#   cargo build --release --bin map-router && cargo bench --bench load --no-run
#   scripts/bench-relay.sh LOAD_BIN MAP_ROUTER_BIN [ROUNDS] [CALLS] > results.jsonl
#
# Needs nats-server on PATH. Loopback only; every wait is bounded.
set -euo pipefail
LOAD=$1; BIN=$2; ROUNDS=${3:-3}; CALLS=${4:-5000}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/lib-cluster.sh
. "$(dirname "$0")/lib-cluster.sh"
for round in $(seq "$ROUNDS"); do
  for target in ${TARGETS:-writer standby}; do
    dir=$(mktemp -d)
    start_nats "$dir"
    nats_pid=$NATS_PID; port=$NATS_PORT
    printf '[cluster]\nnode = "writer"\n' > "$dir/writer.toml"
    taskset -c 0 "$BIN" serve --listen 127.0.0.1:0 --config "$dir/writer.toml" \
      --data-dir "$dir/data" --cluster "nats://127.0.0.1:$port" 2> "$dir/log" &
    pid=$!
    url=$(router_url "$dir/log")
    start_standby "$BIN" "$dir" standby "nats://127.0.0.1:$port"
    spid=$STANDBY_PID; sport=$STANDBY_PORT
    [ "$target" = standby ] && url="ws://127.0.0.1:$sport/"
    c0=$(cpu "$pid"); s0=$(cpu "$spid"); n0=$(cpu "$nats_pid")
    res=$(taskset -c 1 timeout 300 "$LOAD" --bench --url "$url" --server-pid "$pid" --test rtt \
      --calls "$CALLS" 2>>"$dir/load.err" | grep '"rtt"' | paste -sd, -) || true
    [ -n "$res" ] || { echo "the load generator failed: $(tail -3 "$dir/load.err")" >&2; }
    c1=$(cpu "$pid"); s1=$(cpu "$spid"); n1=$(cpu "$nats_pid")
    kill -9 "$spid"; wait "$spid" 2>/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
    kill "$nats_pid"; wait "$nats_pid" 2>/dev/null || true
    echo "{\"round\":$round,\"target\":\"$target\",\"writer_ticks\":$((c1 - c0)),\"standby_ticks\":$((s1 - s0)),\"nats_ticks\":$((n1 - n0)),\"result\":[${res}]}"
    rm -rf "$dir"
  done
done
