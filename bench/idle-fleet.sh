#!/usr/bin/env bash
# Idle fleet: one `edgehive cloud` (mutual TLS on loopback, embedded cluster) holding N edges
# of `edgehive loadtest`, which prints one JSON line with the cloud's CPU over the hold and its
# resident memory at the end.
#
#   bench/idle-fleet.sh [EDGES] [HOLD_SECONDS] [CLOUD_BINARY] [LOADTEST_BINARY]
#
# Defaults: 10000 edges, 60 s, target/release/edgehive for both. Give an older build as
# CLOUD_BINARY to compare (the load tool need not be the same build as the cloud).
set -euo pipefail
edges=${1:-10000}
hold=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cloud_bin=${3:-$root/target/release/edgehive}
load_bin=${4:-$root/target/release/edgehive}
# One socket per edge on each side; this machine allows 20,000 open files per process.
ulimit -Sn "$(ulimit -Hn)"
work=$(mktemp -d)
trap 'kill "$cloud" 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/cloud.yaml" <<YAML
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
modules:
  cloudHub:
    nodeLimit: 20000
    # The whole fleet comes from one address: let it have 64 handshakes in progress.
    handshakesPerSource: 64
    websocket:
      address: 127.0.0.1
      port: 0
    https:
      address: 127.0.0.1
      port: 0
    tlsCAFile: $work/ca/rootCA.crt
    tlsCAKeyFile: $work/ca/rootCA.key
    tlsCertFile: $work/certs/server.crt
    tlsPrivateKeyFile: $work/certs/server.key
YAML
"$cloud_bin" cloud --config "$work/cloud.yaml" > "$work/cloud.out" 2> "$work/cloud.err" &
cloud=$!
for _ in $(seq 50); do
  [ -s "$work/cloud.out" ] && break
  sleep 0.1
done
websocket=$(head -1 "$work/cloud.out" | sed -n 's/.*WebSocket on \([^ ,]*\),.*/\1/p')
[ -n "$websocket" ] || { echo "the cloud did not start: $(cat "$work/cloud.err")" >&2; exit 1; }
"$load_bin" loadtest --cloud "$websocket" --edges "$edges" --hold "$hold" --heartbeat 15 --concurrency 64 \
  --ca-cert "$work/ca/rootCA.crt" --ca-key "$work/ca/rootCA.key" --cloud-pid "$cloud"
