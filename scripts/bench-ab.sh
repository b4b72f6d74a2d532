#!/usr/bin/env bash
# A/B of two map-router binaries on the fan-out case of the load generator, alternating, each
# case on a fresh server pinned to core 0 with the generator pinned to core 1. Prints one JSON
# line per run: the binary (a|b), mode, K+S, server CPU ticks (utime+stime from /proc) and the
# generator's result.
#
#   cargo bench --bench load --no-run   # builds target/release/deps/load-*
#   scripts/bench-ab.sh LOAD_BIN BIN_A BIN_B [ROUNDS] [PAYLOAD_BYTES] > results.jsonl
#
# A_ARGS / B_ARGS (optional): extra `serve` arguments for A or B, e.g. the same binary twice
# with B_ARGS="--config metrics-off.toml".
#
# Loopback only; every wait is bounded.
set -euo pipefail
LOAD=$1; A=$2; B=$3; ROUNDS=${4:-3}; PAYLOAD=${5:-1024}
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
for round in $(seq "$ROUNDS"); do
  for label in a b; do
    bin=$A; args=${A_ARGS:-}; [ "$label" = b ] && bin=$B && args=${B_ARGS:-}
    for mode in ephemeral durable; do
      for case in "10 2" "100 10"; do
        read -r K S <<<"$case"
        dir=$(mktemp -d)
        extra=(--ephemeral); [ "$mode" = durable ] && extra=(--data-dir "$dir/data")
        : > "$dir/log"  # exists before the server starts writing (the poll below reads it)
        # shellcheck disable=SC2086 # word splitting of the extra arguments is wanted
        taskset -c 0 "$bin" serve --listen 127.0.0.1:0 "${extra[@]}" $args 2> "$dir/log" &
        pid=$!
        url=$(router_url "$dir/log")
        c0=$(cpu "$pid")
        res=$(taskset -c 1 timeout 300 "$LOAD" --url "$url" --server-pid "$pid" --test fanout \
          --agents "$K" --subscribers "$S" --publishers 2 --messages 20000 \
          --payload-bytes "$PAYLOAD" 2>/dev/null | grep deliveries_per_s | head -n1)
        c1=$(cpu "$pid")
        kill "$pid"; wait "$pid" 2>/dev/null || true
        echo "{\"round\":$round,\"bin\":\"$label\",\"mode\":\"$mode\",\"k\":$K,\"s\":$S,\"cpu_ticks\":$((c1 - c0)),\"result\":$res}"
        rm -rf "$dir"
      done
    done
  done
done
