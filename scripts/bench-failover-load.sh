#!/usr/bin/env bash
# Failover under the fan-out benchmark's load (cluster mode, docs/cluster.md): a live node and
# a standby (both pinned to core 0) on one nats-server (core 1, with the load generator).
# Each round:
#   1. before: the load generator's `fanout` case (2 publishers and 10 member agents on the
#      live node, SUBSCRIBERS dashboards on the standby, MESSAGES messages) to completion;
#   2. the same load again, much longer, and the live node killed with SIGKILL at a random
#      point 1.0-3.0 s into it; the standby's /health polled every 10 ms until it says 200;
#   3. after: the `fanout` case of step 1 on the node that took over (everything there).
# Prints one JSON line per round: the failover time (SIGKILL to 200, ms) and the two runs'
# result lines (msgs_per_s, deliveries_per_s, latency...), so that the throughput after the
# takeover can be compared with the one before.
#
#   cargo build --release --bin map-router && cargo bench --bench load --no-run
#   scripts/bench-failover-load.sh LOAD_BIN MAP_ROUTER_BIN [ROUNDS] [MESSAGES] > results.jsonl
#
# Needs nats-server and curl on PATH. Loopback only; every wait is bounded.
set -euo pipefail
LOAD=$1; BIN=$2; ROUNDS=${3:-5}; MESSAGES=${4:-10000}; SUBSCRIBERS=${SUBSCRIBERS:-4}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/lib-cluster.sh
. "$(dirname "$0")/lib-cluster.sh"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fanout() { # URL-ARGS... : one fan-out run, its result line (or null)
  local out
  out=$(taskset -c 1 timeout 300 "$LOAD" --bench --test fanout --publishers 2 --agents 10 \
    --messages "$MESSAGES" "$@" 2>>"$dir/load.err" | grep '"fanout"') || true
  [ -n "$out" ] || { echo "the load generator failed: $(tail -3 "$dir/load.err")" >&2; out=null; }
  echo "$out"
}
for round in $(seq "$ROUNDS"); do
  dir=$(mktemp -d)
  start_nats "$dir"
  url="nats://127.0.0.1:$NATS_PORT"
  printf '[cluster]\nnode = "live"\n' > "$dir/live.toml"
  taskset -c 0 "$BIN" serve --listen 127.0.0.1:0 --config "$dir/live.toml" \
    --data-dir "$dir/live" --cluster "$url" 2> "$dir/live.log" &
  pid=$!
  w=$(router_url "$dir/live.log")
  start_standby "$BIN" "$dir" standby "$url" 0 'takeover_poll_ms = 100\n'
  spid=$STANDBY_PID; sport=$STANDBY_PORT; s="ws://127.0.0.1:$sport/"
  before=$(fanout --url "$w" --server-pid "$pid" --subscribers "$SUBSCRIBERS" --subscriber-url "$s")
  # The long run the kill interrupts (its own failure is expected: its node dies).
  taskset -c 1 timeout 120 "$LOAD" --bench --test fanout --publishers 2 --agents 10 \
    --messages $((MESSAGES * 50)) --url "$w" --server-pid "$pid" \
    --subscribers "$SUBSCRIBERS" --subscriber-url "$s" > /dev/null 2>&1 &
  lpid=$!
  sleep "$(python3 -c 'import random; print(round(random.uniform(1.0, 3.0), 2))')"
  t0=$(now_ms)
  kill -9 "$pid"
  failover=null
  for _ in $(seq 3000); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$sport/health" 2>/dev/null || true)
    [ "$code" = 200 ] && { failover=$(( $(now_ms) - t0 )); break; }
    sleep 0.01
  done
  kill "$lpid" 2>/dev/null || true; wait "$lpid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  after=null
  [ "$failover" = null ] || after=$(fanout --url "$s" --server-pid "$spid" --subscribers "$SUBSCRIBERS")
  echo "{\"round\":$round,\"failover_ms\":$failover,\"before\":$before,\"after\":$after}"
  kill "$spid"; wait "$spid" 2>/dev/null || true
  kill "$NATS_PID"; wait "$NATS_PID" 2>/dev/null || true
  rm -rf "$dir"
done
