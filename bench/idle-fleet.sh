#!/usr/bin/env bash
# Idle fleet: one `edgehive cloud` (mutual TLS on loopback, embedded cluster) holding N edges
# of `edgehive-loadtest`, which prints one JSON line with the cloud's CPU over the hold and its
# resident memory at the end (and a markdown row).
#
#   bench/idle-fleet.sh [EDGES] [HOLD_SECONDS] [CLOUD_BINARY] [LOADTEST_BINARY]
#
# Defaults: 10000 edges, 60 s, target/release/edgehive and target/release/edgehive-loadtest
# (`cargo build --release -p edgehive && cargo build --release -p edgehive-loadtest`). Give an
# older build as CLOUD_BINARY to compare (the load tool need not be the same build as the cloud).
# It is bench/fleet.sh's `hold` scenario.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
edges=${1:-10000}
hold=${2:-60}
CLOUD_EDGEHIVE=${3:-$root/target/release/edgehive} \
  LOADTEST=${4:-$root/target/release/edgehive-loadtest} \
  exec "$root/bench/fleet.sh" hold "$edges" --hold "$hold"
