# Shell helpers sourced by the scripts here (not run on its own).

# The ws:// URL a router prints in LOG ("map-router listening on ws://..."), waiting up to 10 s
# for it; prints the log to stderr and fails when the router did not start.
router_url() {
  local log=$1 url=""
  for _ in $(seq 100); do
    url=$(sed -n 's/^map-router listening on \(ws:[^ ]*\)$/\1/p' "$log" | head -n1)
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "the router did not start: $(cat "$log")" >&2; return 1; }
  echo "$url"
}

# User + system CPU ticks (100 per second) of process PID so far.
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
