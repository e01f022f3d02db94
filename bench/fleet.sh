#!/usr/bin/env bash
# A scenario of `edgehive loadtest` against one `edgehive cloud` (mutual TLS on loopback, the
# embedded cluster in a SQLite file): prints the tool's JSON line and its markdown row.
#
#   bench/fleet.sh SCENARIO EDGES [loadtest arguments...]
#   bench/fleet.sh fanout 1000 --rate 1000 --changes 30000
#   bench/fleet.sh storm 10000
#
# The tool creates the fleet's Nodes and writes the changes through the cloud's admin endpoint.
set -euo pipefail
scenario=${1:?scenario: hold, fanout or storm}
edges=${2:?edges}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
# EDGEHIVE: the load tool's binary; CLOUD_EDGEHIVE: the cloud's (an older build to compare).
bin=${EDGEHIVE:-$root/target/release/edgehive}
cloud_bin=${CLOUD_EDGEHIVE:-$bin}
# One socket per edge on each side; this machine allows 20,000 open files per process.
ulimit -Sn "$(ulimit -Hn)"
work=$(mktemp -d)
trap 'kill "$cloud" 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/cloud.yaml" <<YAML
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: $work/cluster.db
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
banner=$(head -1 "$work/cloud.out")
websocket=$(sed -n 's/.*WebSocket on \([^ ,]*\),.*/\1/p' <<<"$banner")
admin=$(sed -n 's/.*admin on http:\/\/\([^ ,]*\).*/\1/p' <<<"$banner")
[ -n "$websocket" ] || { echo "the cloud did not start: $(cat "$work/cloud.err")" >&2; exit 1; }
"$bin" loadtest --cloud "$websocket" --admin "$admin" --edges "$edges" --scenario "$scenario" \
  --heartbeat 15 --concurrency 64 --ca-cert "$work/ca/rootCA.crt" --ca-key "$work/ca/rootCA.key" \
  --cloud-pid "$cloud" --markdown "$@"
