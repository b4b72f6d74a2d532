#!/usr/bin/env bash
# Issue 14's acceptance through the official Python A2A client: creates (once) a virtual
# environment in tests/a2a_py/.venv with tests/a2a_py/requirements.txt (a2a-sdk==1.3.0, pinned
# with its dependencies), then runs tests/a2a_py/acceptance.py against the built router.
#
#   scripts/a2a_py.sh [path-to-map-router]   (default target/debug/map-router)
#
# Needs python3 (>= 3.10, with the venv module), node and tests/interop/node_modules (the MAP
# echo agent is written with the official MAP SDK; scripts/test.sh installs it first).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/map-router}
venv=tests/a2a_py/.venv
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s tests/a2a_py/requirements.txt "$stamp"; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/a2a_py/requirements.txt
  cp tests/a2a_py/requirements.txt "$stamp"
fi
timeout 300 "$venv/bin/python" tests/a2a_py/acceptance.py --bin "$bin"
