#!/usr/bin/env bash
# The federation link's cost (docs/performance.md, "Federation"): two routers with their own
# data directories and keys (alpha dials beta), an SDK agent on each; the sender on alpha sends
# COUNT messages to the agent on beta (scripts/bench-federation.mjs). Alpha is pinned to core
# 0, beta to core 1, the Node agents share core 1. ROUNDS runs; one JSON line each: the
# agents' result and each router's CPU ticks (100 per second), per message in microseconds.
#
#   cargo build --release --bin map-router
#   scripts/bench-federation.sh target/release/map-router [ROUNDS] [COUNT] [WINDOW]
#
# Loopback only; every wait is bounded.
set -euo pipefail
BIN=$1; ROUNDS=${2:-3}; COUNT=${3:-20000}; WINDOW=${4:-64}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
for round in $(seq "$ROUNDS"); do
  dir=$(mktemp -d)
  pa=$(free_port); pb=$(free_port)
  printf 'ak-agents-alpha-0123456789abcdef agents-alpha\nak-link-beta-to-alpha-0123456789ab beta-gw\n' > "$dir/alpha-keys"
  printf 'ak-agents-beta-0123456789abcdef agents-beta\nak-link-alpha-to-beta-0123456789ab alpha-gw\n' > "$dir/beta-keys"
  chmod 600 "$dir"/*-keys
  for s in alpha beta; do
    if [ $s = alpha ]; then peer=beta; pp=$pb; else peer=alpha; pp=$pa; fi
    printf '[auth.api_keys]\nfile = "%s"\n[federation]\nsystem_id = "%s"\nmax_queued = %s\n[[federation.peer]]\nsystem_id = "%s"\nprincipal = "%s-gw"\nendpoint = "ws://127.0.0.1:%s/"\napi_key_env = "FED_KEY"\n' \
      "$dir/$s-keys" "$s" "$((COUNT + 1000))" "$peer" "$peer" "$pp" > "$dir/$s.toml"
  done
  FED_KEY=ak-link-alpha-to-beta-0123456789ab taskset -c 0 "$BIN" serve --listen "127.0.0.1:$pa" \
    --config "$dir/alpha.toml" --data-dir "$dir/alpha" 2> "$dir/alpha.log" &
  apid=$!
  FED_KEY=ak-link-beta-to-alpha-0123456789ab taskset -c 1 "$BIN" serve --listen "127.0.0.1:$pb" \
    --config "$dir/beta.toml" --data-dir "$dir/beta" 2> "$dir/beta.log" &
  bpid=$!
  router_url "$dir/alpha.log" > /dev/null
  router_url "$dir/beta.log" > /dev/null
  for _ in $(seq 100); do grep -q "federation link up" "$dir/alpha.log" && break; sleep 0.1; done
  a0=$(cpu "$apid"); b0=$(cpu "$bpid")
  res=$(taskset -c 1 timeout 320 node scripts/bench-federation.mjs "ws://127.0.0.1:$pa/" \
    ak-agents-alpha-0123456789abcdef "ws://127.0.0.1:$pb/" ak-agents-beta-0123456789abcdef \
    "$COUNT" "$WINDOW") || { echo "the agents failed; alpha: $(tail -3 "$dir/alpha.log")" >&2; res=null; }
  a1=$(cpu "$apid"); b1=$(cpu "$bpid")
  kill "$apid" "$bpid"; wait "$apid" "$bpid" 2>/dev/null || true
  echo "{\"round\":$round,\"alpha_ticks\":$((a1 - a0)),\"beta_ticks\":$((b1 - b0)),\"alpha_us_per_msg\":$(( (a1 - a0) * 10000 / COUNT )),\"beta_us_per_msg\":$(( (b1 - b0) * 10000 / COUNT )),\"result\":$res}"
  rm -rf "$dir"
done
