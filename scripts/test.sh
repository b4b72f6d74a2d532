#!/usr/bin/env bash
# Runs every test of map-router: unit and integration tests (including the schema check and the
# built binary), the benches in test mode, the interop suite in which the official
# @multi-agent-protocol/sdk clients drive the built binary over real WebSockets (and the
# official @a2a-js/sdk client drives its A2A gateway), the gateway suite in which the seeds'
# Python clients (httpx, websockets) drive the MAMP and IM gateways (tests/gateways/), Python
# gRPC drives the AIP gateway (tests/aip_py/), our Python MAP client (python/) drives the router
# (tests/python/), and the
# web dashboard in headless Chromium (tests/browser/).
#
# Needs what scripts/test-deps.txt lists; scripts/setup.sh installs or checks it all first (as root
# it installs missing Debian packages; otherwise it prints the one `sudo apt-get install` line and
# stops before any test runs). Touches only loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

echo "== setup (scripts/setup.sh: system packages, npm packages, Python virtual environments)"
scripts/setup.sh

echo "== cargo test (unit, integration, benches in test mode)"
cargo test --locked --all-targets
cargo test --locked --doc

echo "== interop suite (official SDK clients against target/debug/map-router)"
cargo build --locked --bin map-router
node tests/interop/run.mjs --bin target/debug/map-router
echo "== interop suite, clients spread over a writer and two standbys on one nats-server (cluster mode)"
MAP_INTEROP_SPREAD=1 node tests/interop/run.mjs --bin target/debug/map-router
node tests/interop/quickstart.mjs --bin target/debug/map-router
echo "== A2A interop (@a2a-js/sdk clients against the A2A gateway of target/debug/map-router)"
node tests/interop/a2a.mjs --bin target/debug/map-router
echo "== A2A interop spread: the A2A clients call a standby's gateway, the MAP agents alternate between it and the writer"
MAP_INTEROP_SPREAD=1 node tests/interop/a2a.mjs --bin target/debug/map-router
echo "== A2A client side (the gateway calls remote agents served by @a2a-js/sdk's own server classes)"
node tests/interop/a2a_remote.mjs --bin target/debug/map-router
echo "== A2A acceptance through the Python a2a-sdk 1.3.0 client (v1.0 and v0.3 mode; venv in tests/a2a_py/.venv)"
scripts/a2a_py.sh target/debug/map-router
echo "== traces out (issue 45): SDK agents, an A2A call and an AIP tool call under one caller's trace, read back from Arize Phoenix (venv in tests/phoenix/.venv)"
node tests/interop/traces.mjs --bin target/debug/map-router
echo "== AIP acceptance through Python gRPC (grpcio 1.73.1, stubs by grpcio-tools; venv in tests/aip_py/.venv)"
scripts/aip_py.sh target/debug/map-router
echo "== AIP acceptance spread: the Python gRPC nodes on a standby's AIP gateway, the MAP agent on the live node"
scripts/aip_py.sh target/debug/map-router --spread

echo "== Python MAP client (python/, its wheel, mypy --strict, examples/python, TS SDK peers; venv in tests/python/.venv)"
scripts/python_suite.sh target/debug/map-router

echo "== gateway suite (the seeds' Python clients against target/debug/map-router)"
gateways_python=$(tests/gateways/setup.sh)
"$gateways_python" tests/gateways/run.py --bin target/debug/map-router
echo "== gateway suite spread: the seeds' clients on a standby's gateways, the MAP agents on the live node"
"$gateways_python" tests/gateways/run.py --bin target/debug/map-router --spread

echo "== browser tests (the /ui dashboard in headless Chromium against target/debug/map-router)"
node tests/browser/run.mjs --bin target/debug/map-router

echo "== Rust client examples against target/debug/map-router"
cargo build --locked --bin map-router --examples
router_dir=$(mktemp -d)
router_log="$router_dir/router.log"
: > "$router_log" # exists before the router's shell opens it, so the first read cannot race
target/debug/map-router --listen 127.0.0.1:0 --data-dir "$router_dir/data" 2> "$router_log" &
router_pid=$!
trap 'kill "$router_pid" ${agent_pid:-} 2>/dev/null || true; rm -rf "$router_dir"' EXIT
MAP_ROUTER_URL=$(router_url "$router_log")
export MAP_ROUTER_URL
timeout 60 target/debug/examples/embedded
timeout 60 target/debug/examples/dashboard --seconds 1
timeout 60 target/debug/examples/agent --seconds 30 &
agent_pid=$!
timeout 60 target/debug/examples/orchestrator
timeout 60 target/debug/examples/supervise
wait "$agent_pid" # the orchestrator stops the agent, which then exits 0
kill "$router_pid"
wait "$router_pid"
