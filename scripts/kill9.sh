#!/usr/bin/env bash
# More rounds of the kill -9 check than CI runs (tests/durability.rs,
# `kill_9_at_random_points_never_erases_what_a_subscriber_saw`): the router under load is killed
# with SIGKILL at a random moment, restarted on the same data directory, and checked against
# what a live subscriber was shown and what senders were answered. Release build; loopback only.
#
#   scripts/kill9.sh [ROUNDS] [SEED]     # default 200 rounds, a new seed (printed)
set -euo pipefail
cd "$(dirname "$0")/.."
export MAP_KILL9_ROUNDS=${1:-200}
[ -n "${2:-}" ] && export MAP_KILL9_SEED=$2
cargo test --locked --release --test durability kill_9_at_random_points_never_erases_what_a_subscriber_saw -- --nocapture
