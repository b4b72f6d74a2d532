#!/usr/bin/env bash
# Issue 14's acceptance through the official Python A2A client: runs tests/a2a_py/acceptance.py,
# in the virtual environment tests/a2a_py/.venv that scripts/setup.sh makes from
# tests/a2a_py/requirements.txt (a2a-sdk==1.3.0, pinned with its dependencies), against the
# built router.
#
#   scripts/a2a_py.sh [path-to-map-router]   (default target/debug/map-router)
#
# Needs node and tests/interop/node_modules (the MAP echo agent is written with the official MAP
# SDK); scripts/setup.sh installs both.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/map-router}
venv=tests/a2a_py/.venv
[ -x "$venv/bin/python" ] || { echo "a2a_py.sh: no $venv: run scripts/setup.sh first" >&2; exit 1; }
timeout 300 "$venv/bin/python" tests/a2a_py/acceptance.py --bin "$bin"
