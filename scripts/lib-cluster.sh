# Shell helpers of the cluster benchmarks (bench-cluster.sh, bench-relay.sh), sourced by
# them only (not by the test command: these start nats-server and router nodes pinned to
# cores). Needs scripts/lib.sh sourced first.

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts nats-server (JetStream, its store in DIR/nats, pinned to core 1) on a free port and
# waits (up to 10 s) until it listens. Sets NATS_PORT and NATS_PID (call it directly, not in
# $(...)).
start_nats() {
  local dir=$1
  NATS_PORT=$(free_port)
  taskset -c 1 nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$dir/nats" 2> "$dir/nats.log" &
  NATS_PID=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null && break
    sleep 0.1
  done
}

# Starts a standby node NAME of router BIN (pinned to CORE, 1 by default; files under DIR) on
# the cluster at NATS_URL, on a free port, with EXTRA lines (printf escapes) in its [cluster]
# section, and waits (up to 10 s) until its /health says it serves. Sets STANDBY_PORT and
# STANDBY_PID (call it directly, not in $(...)).
start_standby() {
  local bin=$1 dir=$2 name=$3 nats_url=$4 core=${5:-1} extra=${6:-}
  STANDBY_PORT=$(free_port)
  printf '[cluster]\nnode = "%s"\nstandby = true\n%b' "$name" "$extra" > "$dir/$name.toml"
  taskset -c "$core" "$bin" serve --listen "127.0.0.1:$STANDBY_PORT" --config "$dir/$name.toml" \
    --data-dir "$dir/$name" --cluster "$nats_url" 2> "$dir/$name.log" &
  STANDBY_PID=$!
  for _ in $(seq 100); do
    curl -s "http://127.0.0.1:$STANDBY_PORT/health" 2>/dev/null | grep -q '^serving:' && break
    sleep 0.1
  done
}

# Starts a three-server NATS cluster (JetStream, stores under DIR/nats-0..2, all pinned to
# core 1) on free ports and waits (up to 10 s each) until they listen. Sets NATS_PORT (the
# first server's, which the routers connect to) and NATS_PIDS (all three; call it directly).
start_nats_r3() {
  local dir=$1 i routes="" ports=() cports=()
  for i in 0 1 2; do ports+=("$(free_port)"); cports+=("$(free_port)"); done
  for i in 0 1 2; do routes+="${routes:+,}nats://127.0.0.1:${cports[$i]}"; done
  NATS_PIDS=""
  for i in 0 1 2; do
    taskset -c 1 nats-server -a 127.0.0.1 -p "${ports[$i]}" -js -sd "$dir/nats-$i" -n "r3-$i" \
      --cluster_name r3 --cluster "nats://127.0.0.1:${cports[$i]}" --routes "$routes" \
      2> "$dir/nats-$i.log" &
    NATS_PIDS+="${NATS_PIDS:+ }$!"
  done
  for i in 0 1 2; do
    for _ in $(seq 100); do
      (exec 3<>"/dev/tcp/127.0.0.1/${ports[$i]}") 2>/dev/null && break
      sleep 0.1
    done
  done
  NATS_PORT=${ports[0]}
}

# The CPU ticks of every process in the list PIDS, summed.
cpu_all() { local t=0 p; for p in $1; do t=$((t + $(cpu "$p"))); done; echo "$t"; }
