#!/usr/bin/env bash
# Sets up what the tests need, before any of them runs (scripts/test.sh calls it first):
#
# 1. the system programs listed in scripts/test-deps.txt: those missing are installed with
#    apt-get when this runs as root; otherwise it prints the one `sudo apt-get install ...` line
#    that installs them and exits 1;
# 2. Node.js >= 20 (Debian's own nodejs may be older: then it says so and exits 1);
# 3. the npm packages of tests/interop and tests/browser (npm ci, pinned by their lock files);
# 4. the Python virtual environments (tests/gateways/setup.sh, tests/a2a_py/.venv,
#    tests/aip_py/.venv, tests/python/.venv: the Python MAP client's suite, and
#    tests/phoenix/.venv: Arize Phoenix, the OTLP receiver of the traces tests, about 45 s and
#    850 MB fresh), pinned;
# 5. the Python MAP client's wheel, in target/python/.
#
#   scripts/setup.sh [--check]    --check: report what is missing, install nothing
#
# Idempotent: a second run changes nothing and takes a second or two.
set -euo pipefail
cd "$(dirname "$0")/.."
check_only=false
[ "${1:-}" = "--check" ] && check_only=true

say() { echo "setup: $*" >&2; }

# 1. System programs.
missing_packages=()
missing_names=()
while read -r kind name package _; do
  case "$kind" in ''|'#'*) continue ;; esac
  present=true
  case "$kind" in
    program) command -v "$name" >/dev/null 2>&1 || present=false ;;
    essential)
      for one in ${name//,/ }; do
        command -v "$one" >/dev/null 2>&1 || { say "$one is missing (a Debian essential program)"; exit 1; }
      done ;;
    python) command -v python3 >/dev/null 2>&1 && python3 -c "import ensurepip, $name" 2>/dev/null || present=false ;;
    *) say "scripts/test-deps.txt: unknown kind '$kind'"; exit 2 ;;
  esac
  if ! $present; then
    missing_names+=("$name")
    [ "$package" != "-" ] && missing_packages+=("$package")
  fi
done < scripts/test-deps.txt

for name in "${missing_names[@]}"; do
  if [ "$name" = cargo ]; then
    say "cargo is missing: install Rust with rustup (https://rustup.rs), then run this again"
    exit 1
  fi
done

if [ ${#missing_packages[@]} -gt 0 ]; then
  if $check_only; then
    say "missing: ${missing_names[*]} (sudo apt-get install -y ${missing_packages[*]})"
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: ${missing_names[*]}; install them with:"
    echo "sudo apt-get install -y ${missing_packages[*]}"
    exit 1
  fi
  say "installing ${missing_packages[*]} (for ${missing_names[*]})"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_packages[@]}" >&2
fi

# 2. Node.js >= 20 (the SDKs' WebSocket and fetch; Debian 12's own nodejs is 18).
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  say "Node.js $(node --version) is too old: the tests need Node.js >= 20 (https://nodejs.org)"
  exit 1
fi

$check_only && exit 0

# 3. npm packages, pinned by the lock files (no install scripts run).
for dir in tests/interop tests/browser; do
  if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    say "npm ci in $dir"
    (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2
  fi
done

# 4. Python virtual environments, pinned by their requirements files.
tests/gateways/setup.sh >/dev/null
for dir in tests/a2a_py tests/aip_py tests/python tests/phoenix; do
  venv=$dir/.venv
  if [ ! -x "$venv/bin/python" ] || ! cmp -s "$dir/requirements.txt" "$venv/.requirements"; then
    say "making $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$dir/requirements.txt" >&2
    cp "$dir/requirements.txt" "$venv/.requirements"
  fi
done

# 5. The Python MAP client's wheel (python/, pure Python: one py3-none-any file), built offline
#    with the pinned hatchling of tests/python/.venv into target/python/ (`pip install` it).
rm -rf target/python
tests/python/.venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps \
  --no-build-isolation --no-index -w target/python ./python >&2
for wheel in target/python/*.whl; do say "built $wheel"; done
say "ready"
