#!/usr/bin/env bash
# Issue 25's acceptance through Python gRPC: generates the AIP stubs from
# src/gateway/aip/proto/schema.proto with grpcio-tools (pinned in tests/aip_py/requirements.txt,
# installed by scripts/setup.sh in tests/aip_py/.venv), then runs tests/aip_py/acceptance.py
# against the built router, and (without --spread) tests/aip_py/example.py, which runs the
# example AIP tool and agents of examples/aip-python/ as docs/aip.md tells users to.
#
#   scripts/aip_py.sh [path-to-map-router [--spread]]   (default target/debug/map-router)
#
# --spread: a live node and a standby on one nats-server, the AIP nodes on the standby's gateway.
#
# Needs node and tests/interop/node_modules (the MAP agent on the other side is written with the
# official MAP SDK); scripts/setup.sh installs both.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/map-router}
venv=tests/aip_py/.venv
[ -x "$venv/bin/python" ] || { echo "aip_py.sh: no $venv: run scripts/setup.sh first" >&2; exit 1; }
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
"$venv/bin/python" -m grpc_tools.protoc -I src/gateway/aip/proto --python_out="$stubs" \
  --grpc_python_out="$stubs" schema.proto
timeout 600 "$venv/bin/python" tests/aip_py/acceptance.py --bin "$bin" --stubs "$stubs" "${@:2}"
if [ "${2:-}" != "--spread" ]; then
  timeout 120 "$venv/bin/python" tests/aip_py/example.py --bin "$bin" --stubs "$stubs"
fi
