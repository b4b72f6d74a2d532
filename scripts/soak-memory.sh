#!/usr/bin/env bash
# The memory soaks (issue 23, item 5), each on a fresh release server with a durable store in a
# temporary directory and a 4 MiB in-memory event window, the server pinned to core 0 and the
# soak to core 1 (when taskset exists). Prints one JSON line per soak (benches/soak.rs says
# what each reports); docs/performance.md, "Memory soaks", has the figures and the commands.
#
#   scripts/soak-memory.sh [items|churn|all]          # about 3 minutes for both
#
# BIN=path      soak another build of map-router (an older one gives the "before" figures)
# SOAK=path     the soak binary (default: built by `cargo bench --bench soak --no-run`)
# ITEMS_ARGS, CHURN_ARGS  extra arguments for the soak (e.g. ITEMS_ARGS="--tasks 10000")
# REPEAT=N      run each soak N times against the same server (default 1): the second run's
#               "before" is the first's "after", so what one soak leaves behind for good shows as
#               growth from run to run
#
# Loopback only; every wait is bounded. Not part of the test run.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
which=${1:-all}
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin map-router >&2
  BIN=target/release/map-router
fi
if [ -z "${SOAK:-}" ]; then
  cargo bench --bench soak --no-run >&2
  SOAK=$(find target/release/deps -maxdepth 1 -type f -executable -name 'soak-*' -printf '%T@ %p\n' \
    | sort -n | tail -n1 | cut -d' ' -f2)
fi
# taskset execs the program, so `$!` of a backgrounded `$PIN0 "$BIN" ... &` is the server's own
# pid (a shell function there would put a subshell between them: its pid, RSS and kill).
if command -v taskset >/dev/null; then PIN0="taskset -c 0"; PIN1="taskset -c 1"; else PIN0=""; PIN1=""; fi

soak() {  # soak NAME ARGS...
  local name=$1; shift
  local dir; dir=$(mktemp -d)
  printf '[events]\nretention_bytes = 4194304\n' > "$dir/config.toml"
  : > "$dir/log"
  # shellcheck disable=SC2086 # PIN0 is a command prefix, split on purpose
  $PIN0 "$BIN" serve --listen 127.0.0.1:0 --data-dir "$dir/data" --config "$dir/config.toml" \
    2> "$dir/log" &
  local pid=$! url
  url=$(router_url "$dir/log") || { kill "$pid"; exit 1; }
  for _ in $(seq "${REPEAT:-1}"); do
    # shellcheck disable=SC2086
    $PIN1 timeout 900 "$SOAK" --bench --url "$url" --server-pid "$pid" --test "$name" \
      --data-dir "$dir/data" "$@" || echo "{\"test\":\"$name\",\"failed\":true}"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

# shellcheck disable=SC2086 # word splitting of the extra arguments is wanted
case $which in
  items) soak items ${ITEMS_ARGS:-} ;;
  churn) soak churn ${CHURN_ARGS:-} ;;
  all) soak items ${ITEMS_ARGS:-}; soak churn ${CHURN_ARGS:-} ;;
  *) echo "usage: $0 [items|churn|all]" >&2; exit 2 ;;
esac
