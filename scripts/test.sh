#!/usr/bin/env bash
# Runs every test of map-router: unit and integration tests (including the schema check and the
# built binary), the benches in test mode, and the interop suite in which the official
# @multi-agent-protocol/sdk clients drive the built binary over real WebSockets.
#
# Needs: cargo, node (>= 20) and npm. Touches only loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test (unit, integration, benches in test mode)"
cargo test --locked --all-targets
cargo test --locked --doc

echo "== interop suite (official SDK clients against target/debug/map-router)"
cargo build --locked --bin map-router
(cd tests/interop && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
node tests/interop/run.mjs --bin target/debug/map-router
node tests/interop/quickstart.mjs --bin target/debug/map-router
