#!/usr/bin/env bash
# One router node with its log in SQLite (durable) against the same node with its log in NATS
# JetStream (`--cluster`, one local nats-server), and against three nodes on that stream
# (`followers`: the writer plus two standbys that serve subscriptions from the stream, the
# subscribers spread over the two standbys, the agents on the writer), on the fan-out case of
# the load generator, alternating. The writer is pinned to core 0; the generator, nats-server
# and the standbys share core 1. Prints one JSON line per run: the mode, K+S, the writer's,
# the standbys' and nats-server's CPU ticks (utime+stime from /proc, 100 per second) and the
# generator's result. CPU per delivery is (all routers + nats) ticks * 10 ms / deliveries.
#
#   cargo build --release --bin map-router && cargo bench --bench load --no-run
#   scripts/bench-cluster.sh LOAD_BIN MAP_ROUTER_BIN [ROUNDS] [PAYLOAD_BYTES] [MODES] > results.jsonl
#
# MODES defaults to "sqlite jetstream followers"; CASES ("K S;K S", default "10 2;100 10")
# the agents and subscribers of each run. Needs nats-server on PATH. Loopback only;
# every wait is bounded.
set -euo pipefail
LOAD=$1; BIN=$2; ROUNDS=${3:-3}; PAYLOAD=${4:-1024}; MODES=${5:-sqlite jetstream followers}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/lib-cluster.sh
. "$(dirname "$0")/lib-cluster.sh"
for round in $(seq "$ROUNDS"); do
  for store in $MODES; do
    IFS=';' read -ra cases <<< "${CASES:-10 2;100 10}"
    for case in "${cases[@]}"; do
      read -r K S <<<"$case"
      dir=$(mktemp -d)
      nats_pid=""
      extra=(--data-dir "$dir/data")
      if [ "$store" != sqlite ]; then
        start_nats "$dir"
        nats_pid=$NATS_PID
        extra+=(--cluster "nats://127.0.0.1:$NATS_PORT")
      fi
      : > "$dir/log"
      printf '[cluster]\nnode = "writer"\n' > "$dir/writer.toml"
      taskset -c 0 "$BIN" serve --listen 127.0.0.1:0 --config "$dir/writer.toml" "${extra[@]}" 2> "$dir/log" &
      pid=$!
      url=$(router_url "$dir/log")
      subs=(); standbys=()
      if [ "$store" = followers ]; then
        for n in 1 2; do
          start_standby "$BIN" "$dir" "standby-$n" "${extra[3]}"
          standbys+=("$STANDBY_PID")
          subs+=(--subscriber-url "ws://127.0.0.1:$STANDBY_PORT/")
        done
      fi
      standby_cpu() { local t=0; for p in "${standbys[@]}"; do t=$((t + $(cpu "$p"))); done; echo "$t"; }
      c0=$(cpu "$pid"); n0=0; [ -n "$nats_pid" ] && n0=$(cpu "$nats_pid"); f0=$(standby_cpu)
      res=$(taskset -c 1 timeout 300 "$LOAD" --url "$url" --server-pid "$pid" --test fanout \
        --agents "$K" --subscribers "$S" --publishers 2 --messages 20000 "${subs[@]}" \
        --payload-bytes "$PAYLOAD" 2>/dev/null | grep deliveries_per_s | head -n1)
      c1=$(cpu "$pid"); n1=0; [ -n "$nats_pid" ] && n1=$(cpu "$nats_pid"); f1=$(standby_cpu)
      # A standby holds nothing to flush: SIGKILL.
      for p in "${standbys[@]}"; do kill -9 "$p"; wait "$p" 2>/dev/null || true; done
      kill "$pid"; wait "$pid" 2>/dev/null || true
      if [ -n "$nats_pid" ]; then kill "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; fi
      echo "{\"round\":$round,\"store\":\"$store\",\"k\":$K,\"s\":$S,\"router_ticks\":$((c1 - c0)),\"standby_ticks\":$((f1 - f0)),\"nats_ticks\":$((n1 - n0)),\"result\":${res:-null}}"
      rm -rf "$dir"
    done
  done
done
