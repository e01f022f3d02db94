#!/usr/bin/env bash
# `kubectl logs -f` through CloudStream: `edgehive-loadtest --scenario streams` against one
# `edgehive cloud` (mutual TLS on loopback, CloudStream on, the API server's client CA made
# here): simulated edges keep a stream tunnel each and answer every LOGS_CONNECT with DATA,
# simulated API-server clients follow the logs. Prints the tool's JSON line.
#
#   cargo build --release -p edgehive && cargo build --release -p edgehive-loadtest
#   bench/streams.sh NODES STREAMS [edgehive-loadtest arguments...]
#   bench/streams.sh 1 1 --chunk 32768 --hold 10                         # one stream, flat out
#   bench/streams.sh 100 100 --chunk 32768 --hold 10                     # 100 at once
#   bench/streams.sh 100 1000 --chunk 256 --chunk-interval-ms 1000 --hold 10   # memory per stream
set -euo pipefail
nodes=${1:?nodes}
streams=${2:?streams}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${LOADTEST:-$root/target/release/edgehive-loadtest}
cloud_bin=${CLOUD_EDGEHIVE:-$root/target/release/edgehive}
ulimit -Sn "$(ulimit -Hn)"
work=$(mktemp -d)
trap 'kill "$cloud" 2>/dev/null || true; rm -rf "$work"' EXIT
# The API server's client CA (tlsStreamCAFile), a P-256 CA in PEM, made with openssl.
openssl ecparam -name prime256v1 -genkey -noout -out "$work/api-ca.key" 2>/dev/null
openssl req -x509 -new -key "$work/api-ca.key" -days 2 -subj /CN=api-ca -out "$work/api-ca.crt" 2>/dev/null
cat > "$work/cloud.yaml" <<YAML
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: $work/cluster.db
modules:
  cloudHub:
    # All tunnels and API-server connections come from one address.
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
  cloudStream:
    enable: true
    address: 127.0.0.1
    streamPort: 0
    tunnelPort: 0
    tlsStreamCAFile: $work/api-ca.crt
YAML
"$cloud_bin" cloud --config "$work/cloud.yaml" > "$work/cloud.out" 2> "$work/cloud.err" &
cloud=$!
for _ in $(seq 50); do
  [ -s "$work/cloud.out" ] && break
  sleep 0.1
done
banner=$(head -1 "$work/cloud.out")
tunnel=$(sed -n 's/.*stream tunnels on \([^ ,]*\),.*/\1/p' <<<"$banner")
stream=$(sed -n 's/.*streams on https:\/\/\([^ ,]*\).*/\1/p' <<<"$banner")
[ -n "$tunnel" ] || { echo "the cloud did not start: $(cat "$work/cloud.err")" >&2; exit 1; }
"$tool" --scenario streams --tunnel "$tunnel" --stream "$stream" --edges "$nodes" \
  --streams "$streams" --concurrency 32 \
  --ca-cert "$work/ca/rootCA.crt" --ca-key "$work/ca/rootCA.key" \
  --stream-ca-cert "$work/api-ca.crt" --stream-ca-key "$work/api-ca.key" \
  --cloud-pid "$cloud" "$@"
