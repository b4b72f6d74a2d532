#!/usr/bin/env bash
# Runs the load generator (benches/load.rs) against map-router and against the reference
# MAPServer of @multi-agent-protocol/sdk@0.1.15 (benches/reference/server.mjs), each test on a
# freshly started server, and prints ours/reference ratios. Loopback only.
#
#   scripts/bench-compare.sh [quick]
#   scripts/bench-compare.sh nats [ROUNDS]
#   MAP_ROUTER_BIN=/path/to/map-router scripts/bench-compare.sh ...   # another build
#
# `nats` runs only the 10 + 2 fan-out, ROUNDS times (3), on map-router (as shipped and ephemeral)
# and on Debian's nats-server (core, and JetStream with a file-backed R1 stream and acknowledged
# publishes) through benches/nats.rs, the same shape spoken to NATS, and prints the medians of
# server CPU per delivery and their ratios (issue 48's targets).
#
# Needs cargo, node (>= 20) and npm. Raw JSON lines go to target/bench/compare-<time>.jsonl.
# map-router runs twice: as shipped (durable SQLite store in a temp dir, capped at 64 MiB) and with --ephemeral
# (events in memory only, like the reference). The machine is shared: read ratios and medians
# of several runs, not single figures.
#
# Every server runs pinned to core 0 and the load generator to core 1 (`taskset`), the same way
# for every server; each case also reports the server's CPU time (utime + stime from
# /proc/PID/stat, before and after the case) per unit of work: per delivery for fan-out and
# slow-consumer cases, per call for round trips. Ratios of that figure are the steadiest on a
# shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=${1:-}
# 10 000 sessions need 10 000 descriptors in the server and as many in the generator.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt 10100 ]; then
  echo "bench-compare: file limit $(ulimit -n) is too low for 10 000 connections" >&2
  exit 1
fi

# MAP_ROUTER_BIN: a map-router binary to measure instead of building this checkout's.
if [ -n "${MAP_ROUTER_BIN:-}" ]; then
  router_bin=$MAP_ROUTER_BIN
else
  cargo build --locked --release --bin map-router
  router_bin=target/release/map-router
fi
# LOAD_BIN / NATS_LOAD_BIN: load generators already built (e.g. `cargo build --release --bench
# nats`, which reuses the release build instead of building the bench profile again).
load=${LOAD_BIN:-$(cargo bench --locked --bench load --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)}
[ -x "$load" ] || { echo "bench-compare: no load generator binary" >&2; exit 1; }
if [ "$quick" = nats ]; then
  nats_load=${NATS_LOAD_BIN:-$(cargo bench --locked --bench nats --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)}
  [ -x "$nats_load" ] || { echo "bench-compare: no NATS load generator binary" >&2; exit 1; }
  command -v nats-server >/dev/null || { echo "bench-compare: needs nats-server (apt-get install nats-server)" >&2; exit 1; }
  kinds="ours ours-ephemeral nats-core nats-jetstream nats-jetstream-pull"
else
  (cd benches/reference && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  kinds="ours ours-ephemeral reference"
fi

if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  pin_server=(taskset -c 0); pin_load=(taskset -c 1)
  echo "bench-compare: servers pinned to core 0, the load generator to core 1 (taskset)"
else
  pin_server=(); pin_load=()
  echo "bench-compare: not pinned (needs 2 cores and taskset): figures are noisier"
fi
ticks_per_s=$(getconf CLK_TCK)
# cpu_ticks <pid>: utime + stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

mkdir -p target/bench
out=target/bench/compare-$(date -u +%Y%m%dT%H%M%SZ).jsonl
work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# start <kind>: starts a fresh server of that kind; sets server_pid and url.
start() {
  local log="$work/server.log" line
  : > "$log"
  case "$1" in
    ours) rm -rf "$work/data"
          # As shipped, except that the store keeps at most 64 MiB on disk (default 1 GiB),
          # so that the benchmark cannot fill a small disk.
          printf '[storage]\nmax_bytes = 67108864\n' > "$work/ours.toml"
          "${pin_server[@]}" "$router_bin" --listen 127.0.0.1:0 --data-dir "$work/data" \
            --config "$work/ours.toml" 2> "$log" &
          line='^map-router listening on ' ;;
    ours-ephemeral)
          "${pin_server[@]}" "$router_bin" --listen 127.0.0.1:0 --ephemeral 2> "$log" &
          line='^map-router listening on ' ;;
    reference)
          "${pin_server[@]}" node benches/reference/server.mjs 2> "$log" &
          line='^reference listening on ' ;;
    nats-core)
          "${pin_server[@]}" nats-server -a 127.0.0.1 -p -1 2> "$log" &
          line='Listening for client connections on ' ;;
    nats-jetstream|nats-jetstream-pull)
          rm -rf "$work/js"
          "${pin_server[@]}" nats-server -a 127.0.0.1 -p -1 -js -sd "$work/js" 2> "$log" &
          line='Listening for client connections on ' ;;
  esac
  server_pid=$!
  url=
  for _ in $(seq 100); do
    case "$1" in
      nats-*) url=$(grep -m1 "$line" "$log" | sed 's/.* on \([0-9.]*:[0-9]*\).*/nats:\/\/\1/' || true) ;;
      *) url=$(grep -m1 "$line" "$log" | sed 's/.* on \(ws:[^ ]*\).*/\1/' || true) ;;
    esac
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "bench-compare: $1 did not start:" >&2; cat "$log" >&2; exit 1; }
}

stop() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}

# case <name> <load options...>: runs one case against every server, each freshly started.
case_() {
  local name=$1 kind
  shift
  for kind in $kinds; do
    start "$kind"
    local c0 result
    c0=$(cpu_ticks "$server_pid")
    # The churn case measures the store's growth in the durable server's data directory.
    local data=() gen=("$load") extra=(--server-pid "$server_pid")
    [ "$kind" = ours ] && data=(--data-dir "$work/data")
    case "$kind" in
      nats-core) gen=("$nats_load"); extra=(--mode core) ;;
      nats-jetstream) gen=("$nats_load"); extra=(--mode jetstream --consumer push) ;;
      nats-jetstream-pull) gen=("$nats_load"); extra=(--mode jetstream --consumer pull) ;;
    esac
    # A failed case is reported and the run goes on (the reference fails some at full size).
    if result=$("${pin_load[@]}" "${gen[@]}" --bench --url "$url" "${extra[@]}" \
        --server "$kind" "${data[@]}" "$@"); then
      local cpu_s
      cpu_s=$(echo "$(cpu_ticks "$server_pid") $c0 $ticks_per_s" | awk '{printf "%.3f", ($1 - $2) / $3}')
      echo "$result" | jq -c --arg case "$name" --argjson cpu "$cpu_s" '. + {case: $case,
          server_cpu_s: $cpu,
          server_cpu_us_per_unit: (
            (if .test == "fanout" then .deliveries
             elif .test == "rtt" then (.calls * 2) # one server runs both modes, `calls` each
             elif .test == "slow" then ((.baseline.deliveries // 0) + (.with_laggard.deliveries // 0))
             elif .test == "churn" then .sends
             else null end) as $units
            | if ($units // 0) > 0 then ($cpu * 1e6 / $units * 100 | round) / 100 else null end)}' \
        | tee -a "$out"
    else
      echo "{\"case\":\"$name\",\"server\":\"$kind\",\"failed\":true}" | tee -a "$out"
    fi
    stop
  done
}

# fsync_ms: the p50 and p99 of a 4 KiB write + fsync (2 000 of them) in a file beside the
# durable server's store: the disk's own commit time, printed beside the paced p99.
fsync_ms() {
  python3 - "$work" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
samples = []
for i in range(2000):
    os.pwrite(fd, b"x" * 4096, (i % 256) * 4096)
    t = time.perf_counter()
    os.fsync(fd)
    samples.append((time.perf_counter() - t) * 1000)
os.close(fd)
os.unlink(path)
samples.sort()
print("fsync p50 %.3f ms, p99 %.3f ms, max %.3f ms" % (samples[1000], samples[1980], samples[-1]))
PY
}

if [ "$quick" = nats ]; then
  for round in $(seq "${2:-3}"); do
    case_ "fanout-10x2-r$round" --test fanout --agents 10 --subscribers 2 --messages 20000 --publishers 2
  done
  # The paced target: map-router as shipped at 2 700 msg/s, with the disk's fsync time beside it.
  for round in $(seq "${2:-3}"); do
    kinds=ours case_ "paced-2700-r$round" --test fanout --agents 10 --subscribers 2 --messages 10000 --rate 2700
    echo "disk: $(fsync_ms)" | tee -a "$out.fsync"
  done
  echo
  echo "== server CPU per delivery (µs), medians of ${2:-3} from $out"
  jq -s -r '
    def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
    # Only complete runs: core NATS drops messages for a slow consumer (at most once).
    map(select((.failed | not) and .test == "fanout" and .complete and (.case | startswith("fanout-")))) | group_by(.server)
    | map({key: .[0].server, value: (map(.server_cpu_us_per_unit) | median)}) | from_entries
    | . as $m
    | (to_entries[] | "\(.key): \(.value) µs per delivery"),
      "durable / NATS JetStream, pull consumers: \(($m.ours / $m["nats-jetstream-pull"] * 100 | round) / 100)x",
      "durable / NATS JetStream: \(($m.ours / $m["nats-jetstream"] * 100 | round) / 100)x (target <= 1.2)",
      "ephemeral / NATS core: \(($m["ours-ephemeral"] / $m["nats-core"] * 100 | round) / 100)x (target <= 2)"
  ' "$out"
  echo "== paced 2 700 msg/s, as shipped: latency p99 (ms) per run, and the disk"
  jq -r 'select(.case | startswith("paced-")) | "\(.case): p50 \(.latency_ms.p50) ms, p99 \(.latency_ms.p99) ms, \(.msgs_per_s) msg/s"' "$out"
  cat "$out.fsync"
  exit 0
elif [ "$quick" = quick ]; then
  case_ fanout-10x2 --test fanout --agents 10 --subscribers 2 --messages 2000
  case_ rtt --test rtt --calls 1000
else
  case_ fanout-10x2 --test fanout --agents 10 --subscribers 2 --messages 20000 --publishers 2
  case_ fanout-100x10 --test fanout --agents 100 --subscribers 10 --messages 3000 --publishers 2
  case_ fanout-10x2-at-2700 --test fanout --agents 10 --subscribers 2 --messages 10000 --rate 2700
  case_ rtt --test rtt --calls 5000 --concurrency 8
  case_ connections-1000 --test connections --connections 1000
  case_ connections-10000 --test connections --connections 10000 --timeout-s 120
  case_ slow --test slow --agents 10 --subscribers 2 --messages 10000 --payload-bytes 1024
  case_ churn --test churn --waves 40 --wave-agents 40 --payload-bytes 512
fi

echo
echo "== ratios ours/reference (as shipped, and ephemeral) from $out"
jq -s -r '
  def key: .case + "/" + (.mode // "");
  def metric:
    if .test == "fanout" then {tput: .deliveries_per_s, msgs: .msgs_per_s, p99: .latency_ms.p99}
    elif .test == "rtt" then {tput: .calls_per_s, p99: .latency_ms.p99}
    elif .test == "connections" then {tput: .connected, bytes: .bytes_per_connection, secs: .connect_s}
    elif .test == "slow" then {ratio: .deliveries_per_s_ratio, rss_growth_kb: (.with_laggard.rss_after_kb - .with_laggard.rss_before_kb)}
    elif .test == "churn" then {events_per_send: .observer_events_per_send, observer_bytes_per_send: .observer_bytes_per_send, message_events_per_send: .message_events_per_send, message_bytes_per_send: .message_bytes_per_send, store_bytes_per_send: .store_bytes_per_send}
    else {} end
    + {cpu_us: .server_cpu_us_per_unit};
  map(select(.failed | not)) | group_by(key)[] |
  (map({key: .server, value: metric}) | from_entries) as $m |
  "\(.[0] | key): ours \($m.ours) ephemeral \($m["ours-ephemeral"]) reference \($m.reference)" +
  (if ($m.ours.tput // null) != null and ($m.reference.tput // 0) > 0 then
     "  ratio \(($m.ours.tput / $m.reference.tput * 10 | round) / 10)x / \(($m["ours-ephemeral"].tput / $m.reference.tput * 10 | round) / 10)x"
   else "" end) +
  (if ($m.ours.cpu_us // null) != null and ($m.reference.cpu_us // 0) > 0 then
     "  server CPU per unit ref/ours \(($m.reference.cpu_us / $m.ours.cpu_us * 10 | round) / 10)x / \(($m.reference.cpu_us / $m["ours-ephemeral"].cpu_us * 10 | round) / 10)x"
   else "" end)
' "$out"
