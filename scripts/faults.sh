#!/usr/bin/env bash
# The fault suite as a longer soak than CI runs (tests/cluster_faults.rs): three router nodes on
# a three-server NATS cluster (every link through a TCP proxy the test cuts and heals), agents on
# every node sending numbered messages and dashboards on every node subscribed, while the live
# node is cut from NATS, left alone with a minority, paused (SIGSTOP) and a NATS server is
# killed; the checker's summary (faults, seed, counts, recovery times, what clients saw) is
# printed. Then three nodes started at once, ROUNDS times (issue 44 item 15). Debug build (the
# test profile); loopback only; needs nats-server on PATH.
#
#   scripts/faults.sh [PASSES] [SEED] [ROUNDS]   # default 6 passes over the five faults (30
#                                                # faults), a new seed (printed), 20 rounds
set -euo pipefail
cd "$(dirname "$0")/.."
export MAP_FAULTS_PASSES=${1:-6}
[ -n "${2:-}" ] && export MAP_FAULTS_SEED=$2
export MAP_FAULTS_ROUNDS=${3:-20}
export MAP_FAULTS_HOLD_MS=${MAP_FAULTS_HOLD_MS:-5000}
cargo test --locked --test cluster_faults -- --nocapture --test-threads 1
