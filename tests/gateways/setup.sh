#!/usr/bin/env bash
# Makes the virtual environment of the gateway tests (tests/gateways/run.py): the `httpx` and
# `websockets` packages the seeds' Python clients use, pinned. Prints the venv's python.
# Idempotent: an existing venv with both packages is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${GATEWAYS_VENV:-target/gateways-venv}
if ! "$venv/bin/python" -c 'import httpx, websockets' 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/gateways/requirements.txt >&2
fi
echo "$venv/bin/python"
