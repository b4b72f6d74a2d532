#!/usr/bin/env bash
# Messages across nodes (cluster mode, docs/cluster.md): the load generator's `fanout` case
# (P publisher agents send M messages to a scope of K member agents; no subscribers) with its
# connections placed four ways on a live node and one standby sharing one nats-server:
#   one             everything on the live node (the single-node figure, JetStream log)
#   pub-standby     the publishers on the standby (their sends relayed), the agents on the live node
#   agents-standby  the publishers on the live node, the agents on the standby (deliveries relayed)
#   spread          publishers and agents alternate between the two nodes
#   spread3         a second standby too: publishers and agents rotate over the three nodes
# Alternating, ROUNDS times. The live node is pinned to core 0; nats-server, the standby and
# the generator share core 1. Prints one JSON line per run: the layout, the live node's, the
# standbys' (summed) and nats-server's CPU ticks (100 per second) and the generator's result
# line.
#
#   cargo build --release --bin map-router && cargo bench --bench load --no-run
#   scripts/bench-cross-node.sh LOAD_BIN MAP_ROUTER_BIN [ROUNDS] [MESSAGES] > results.jsonl
#
# NATS=r3 runs a three-server NATS cluster (all on core 1) and a stream with three replicas
# instead of one nats-server (nats_ticks then sums the three).
#
# Needs nats-server on PATH. Loopback only; every wait is bounded.
set -euo pipefail
LOAD=$1; BIN=$2; ROUNDS=${3:-3}; MESSAGES=${4:-20000}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/lib-cluster.sh
. "$(dirname "$0")/lib-cluster.sh"
for round in $(seq "$ROUNDS"); do
  for layout in ${LAYOUTS:-one pub-standby agents-standby spread}; do
    dir=$(mktemp -d)
    if [ "${NATS:-one}" = r3 ]; then
      start_nats_r3 "$dir"; nats_pids=$NATS_PIDS; replicas=3
    else
      start_nats "$dir"; nats_pids=$NATS_PID; replicas=1
    fi
    port=$NATS_PORT
    printf '[cluster]\nnode = "writer"\nreplicas = %s\n' "$replicas" > "$dir/writer.toml"
    # A new NATS cluster elects its JetStream leader first: the writer may be refused (and
    # exit) until then; at most 30 tries.
    for _ in $(seq 30); do
      taskset -c 0 "$BIN" serve --listen 127.0.0.1:0 --config "$dir/writer.toml" \
        --data-dir "$dir/data" --cluster "nats://127.0.0.1:$port" 2> "$dir/log" &
      pid=$!
      for _ in $(seq 100); do
        grep -q '^map-router listening on ' "$dir/log" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      w=$(router_url "$dir/log" 2>/dev/null) && break
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
      sleep 1
    done
    start_standby "$BIN" "$dir" standby "nats://127.0.0.1:$port"
    spid=$STANDBY_PID; s="ws://127.0.0.1:$STANDBY_PORT/"
    if [ "$layout" = spread3 ]; then
      start_standby "$BIN" "$dir" standby2 "nats://127.0.0.1:$port"
      spid="$spid $STANDBY_PID"; s2="ws://127.0.0.1:$STANDBY_PORT/"
    fi
    case $layout in
      one) places=(--publisher-url "$w" --agent-url "$w") ;;
      pub-standby) places=(--publisher-url "$s" --agent-url "$w") ;;
      agents-standby) places=(--publisher-url "$w" --agent-url "$s") ;;
      spread) places=(--publisher-url "$w" --publisher-url "$s" --agent-url "$w" --agent-url "$s") ;;
      spread3) places=(--publisher-url "$w" --publisher-url "$s" --publisher-url "$s2"
        --agent-url "$w" --agent-url "$s" --agent-url "$s2") ;;
    esac
    c0=$(cpu "$pid"); s0=$(cpu_all "$spid"); n0=$(cpu_all "$nats_pids")
    res=$(taskset -c 1 timeout 300 "$LOAD" --bench --url "$w" --server-pid "$pid" --test fanout \
      --subscribers 0 --publishers 2 --agents 10 --messages "$MESSAGES" "${places[@]}" \
      2>>"$dir/load.err" | grep '"fanout"') || true
    [ -n "$res" ] || { echo "the load generator failed: $(tail -3 "$dir/load.err")" >&2; res=null; }
    c1=$(cpu "$pid"); s1=$(cpu_all "$spid"); n1=$(cpu_all "$nats_pids")
    for p in $spid; do kill -9 "$p"; wait "$p" 2>/dev/null || true; done
    kill "$pid"; wait "$pid" 2>/dev/null || true
    for p in $nats_pids; do kill "$p"; wait "$p" 2>/dev/null || true; done
    echo "{\"round\":$round,\"nats\":\"${NATS:-one}\",\"layout\":\"$layout\",\"writer_ticks\":$((c1 - c0)),\"standby_ticks\":$((s1 - s0)),\"nats_ticks\":$((n1 - n0)),\"result\":${res}}"
    rm -rf "$dir"
  done
done
