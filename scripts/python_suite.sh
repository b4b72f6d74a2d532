#!/usr/bin/env bash
# Issue 49's acceptance: the Python MAP client (python/, import map_client) against the built
# router. Runs tests/python/run.py in the virtual environment tests/python/.venv that
# scripts/setup.sh makes from tests/python/requirements.txt (websockets for the client; mypy
# and hatchling for the type check and the wheel, pinned). The suite builds the wheel and
# installs it into a fresh venv of its own, runs mypy --strict on python/ and examples/python/,
# runs every example, and talks to TypeScript SDK peers (node and tests/interop/node_modules,
# which scripts/setup.sh installs too). Loopback only; every router on port 0 in a temp dir.
#
#   scripts/python_suite.sh [path-to-map-router]   (default target/debug/map-router)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/map-router}
venv=tests/python/.venv
[ -x "$venv/bin/python" ] || { echo "python_suite.sh: no $venv: run scripts/setup.sh first" >&2; exit 1; }
[ -d tests/interop/node_modules/@multi-agent-protocol/sdk ] || {
  echo "python_suite.sh: no tests/interop/node_modules: run scripts/setup.sh first" >&2
  exit 1
}
timeout 600 "$venv/bin/python" tests/python/run.py --bin "$bin"
