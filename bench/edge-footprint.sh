#!/usr/bin/env bash
# The edge's footprint as a user runs it: a TLS `edgehive cloud` with PODS pods bound to one
# node, an edge joined with `edgehive join` (certificate bootstrap, mutual TLS), idle for
# IDLE seconds after the last pod is in its SQLite file; then its resident memory, where it
# goes (anonymous vs. file-backed), threads, and the binary's size.
#
#   bench/edge-footprint.sh [PODS=100] [IDLE=10]
#   EDGEHIVE=target/release/edgehive-edge bench/edge-footprint.sh 100   # another binary for the edge
#   INSPECT='python3 bench/edge-pages.py' bench/edge-footprint.sh 100   # then runs `$INSPECT PID`
#
# Needs python3 (its sqlite3 module counts the stored pods).
set -euo pipefail
cd "$(dirname "$0")/.."
PODS=${1:-100}
IDLE=${2:-10}
CLOUD_BIN=${CLOUD_BIN:-target/release/edgehive}
EDGE_BIN=${EDGEHIVE:-$CLOUD_BIN}
for bin in "$CLOUD_BIN" "$EDGE_BIN"; do
  [[ -x $bin ]] || { echo "build it first: cargo build --release ($bin)" >&2; exit 1; }
done
DIR=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
NODE=fp-edge

mkdir -p "$DIR/cloud/manifests"
python3 - "$DIR/cloud/manifests/pods.yaml" "$PODS" "$NODE" <<'EOF'
import sys
path, pods, node = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(path, "w") as out:
    for i in range(pods):
        out.write(f"""---
apiVersion: v1
kind: Pod
metadata:
  name: pod-{i}
  namespace: default
  labels:
    app: bench
spec:
  nodeName: {node}
  containers:
  - name: web
    image: nginx:1.27
    ports:
    - containerPort: 80
""")
EOF
cat >"$DIR/cloud/cloud.yaml" <<EOF
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: ""
modules:
  cloudHub:
    websocket:
      address: 127.0.0.1
      port: 0
    https:
      address: 127.0.0.1
      port: 0
    tlsCAFile: $DIR/cloud/ca/rootCA.crt
    tlsCAKeyFile: $DIR/cloud/ca/rootCA.key
    tlsCertFile: $DIR/cloud/certs/server.crt
    tlsPrivateKeyFile: $DIR/cloud/certs/server.key
EOF

# The first stdout line of a process says where it listens.
banner() {
  local file=$1
  for _ in $(seq 200); do
    [[ -s $file ]] && { head -1 "$file"; return; }
    sleep 0.05
  done
  echo "no banner in $file" >&2; exit 1
}
field() { sed -e "s|.*$2||" -e "s|[$3].*||" <<<"$1"; }

"$CLOUD_BIN" cloud --config "$DIR/cloud/cloud.yaml" --manifests "$DIR/cloud/manifests" \
  >"$DIR/cloud.out" 2>"$DIR/cloud.err" &
PIDS+=($!)
CLOUD_BANNER=$(banner "$DIR/cloud.out")
WEBSOCKET=$(field "$CLOUD_BANNER" "WebSocket on " ",")
CERT_PORT=$(field "$CLOUD_BANNER" "certificates on https://127.0.0.1:" " ")
TOKEN=$("$CLOUD_BIN" token --config "$DIR/cloud/cloud.yaml")

"$EDGE_BIN" join --cloud "$WEBSOCKET" --cert-port "$CERT_PORT" --token "$TOKEN" \
  --node "$NODE" --admin 127.0.0.1:0 --config "$DIR/edge/edge.yaml" --data-dir "$DIR/edge" >/dev/null
"$EDGE_BIN" edge --config "$DIR/edge/edge.yaml" >"$DIR/edge.out" 2>"$DIR/edge.err" &
EDGE=$!
PIDS+=($EDGE)
banner "$DIR/edge.out" >/dev/null
DB=$(sed -n 's/^ *dataSource: *//p' "$DIR/edge/edge.yaml" | tr -d '"')

stored() {
  python3 - "$DB" <<'EOF'
import sqlite3, sys
try:
    print(sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM meta WHERE type = 'pod'").fetchone()[0])
except Exception:
    print(0)
EOF
}
START=$(date +%s)
until [[ $(stored) -ge $PODS ]]; do
  (( $(date +%s) - START < 120 )) || { echo "only $(stored) of $PODS pods after 120 s" >&2; cat "$DIR/edge.err" >&2; exit 1; }
  sleep 0.2
done
sleep "$IDLE"

# Where the resident memory is, by mapping (to standard error).
python3 - "/proc/$EDGE/smaps" <<'EOF' >&2
import collections, sys
rss = collections.Counter()
name = None
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
        name = parts[5] if len(parts) > 5 else "[anon]"
    elif parts and parts[0] == "Rss:":
        rss[name] += int(parts[1])
for name, kib in rss.most_common(8):
    print(f"{kib:>8} KiB  {name}")
EOF
kib() { awk -v key="$1:" '$1 == key { print $2 }' "$2"; }
STATUS=/proc/$EDGE/status
ROLLUP=/proc/$EDGE/smaps_rollup
RSS=$(kib VmRSS "$STATUS")
HWM=$(kib VmHWM "$STATUS")
ANON=$(kib RssAnon "$STATUS")
FILE=$(kib RssFile "$STATUS")
THREADS=$(kib Threads "$STATUS")
PSS=$(kib Pss "$ROLLUP")
SIZE=$(stat -c %s "$(readlink -f "$EDGE_BIN")")
printf '{"pods": %d, "idle_s": %d, "vmrss_kib": %d, "vmhwm_kib": %d, "rss_anon_kib": %d, "rss_file_kib": %d, "pss_kib": %d, "threads": %d, "binary_bytes": %d, "binary": "%s"}\n' \
  "$PODS" "$IDLE" "$RSS" "$HWM" "$ANON" "$FILE" "$PSS" "$THREADS" "$SIZE" "$EDGE_BIN"
# INSPECT: a command to run on the idle edge (its PID appended) before it is stopped.
[[ -z ${INSPECT:-} ]] || $INSPECT "$EDGE" >&2
