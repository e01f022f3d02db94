#!/usr/bin/env bash
# The image as an operator runs it, by hand (not CI): a cloud and an edge, each a container of
# the same image, as the image's non-root user with a read-only root file system and no /tmp
# (only the volume given is writable), on the host's network (loopback only; the edge dials
# `localhost`, resolved in its container). The cloud runs
# the embedded cluster with PODS pods bound to the edge's node; the edge joins with a token
# from `edgehive token` (run in the image too) and must store every pod in its SQLite file.
#
#   deploy/image/smoke.sh [IMAGE=edgehive:<version>] [PODS=20]
#   PODMAN="podman --runtime runc" RUN_FLAGS="--ulimit nofile=20000:20000" deploy/image/smoke.sh
#
# Needs podman (docker works too: PODMAN=docker, which has no --read-only-tmpfs: set
# NO_TMPFS_FLAG=1) and python3 (its sqlite3 counts the stored pods).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE=${1:-edgehive:$VERSION}
PODS=${2:-20}
PODMAN=${PODMAN:-podman}
read -r -a FLAGS <<<"${RUN_FLAGS:-}"
[[ -n ${NO_TMPFS_FLAG:-} ]] || FLAGS+=(--read-only-tmpfs=false)
DIR=$(mktemp -d)
NAME=edgehive-smoke-$$
cleanup() {
  $PODMAN rm -f "$NAME-cloud" "$NAME-edge" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
run() { $PODMAN run --rm --network host --read-only "${FLAGS[@]}" "$@"; }

mkdir -p "$DIR/cloud/manifests" "$DIR/edge"
for i in $(seq "$PODS"); do
  printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: pod-%s, namespace: default}\n' "$i"
  printf 'spec:\n  nodeName: smoke-edge\n  containers: [{name: web, image: nginx:1.27}]\n'
done >"$DIR/cloud/manifests/pods.yaml"
cat >"$DIR/cloud/cloudcore.yaml" <<YAML
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: /etc/kubeedge/cluster.db
modules:
  cloudHub:
    websocket: {address: 127.0.0.1, port: 0}
    https: {address: 127.0.0.1, port: 0}
    tlsCAFile: /etc/kubeedge/ca/rootCA.crt
    tlsCAKeyFile: /etc/kubeedge/ca/rootCA.key
    tlsCertFile: /etc/kubeedge/certs/server.crt
    tlsPrivateKeyFile: /etc/kubeedge/certs/server.key
    dnsNames: [localhost]
YAML
# The image's user (65532) owns its volume; nothing else is writable in its containers.
chown -R 65532:65532 "$DIR/cloud" "$DIR/edge"

run --name "$NAME-cloud" -v "$DIR/cloud:/etc/kubeedge" "$IMAGE" \
  cloud --config /etc/kubeedge/cloudcore.yaml --manifests /etc/kubeedge/manifests \
  >"$DIR/cloud.out" 2>"$DIR/cloud.err" &
# The first stdout line of a process says where it listens.
banner() {
  for _ in $(seq 600); do
    [[ -s $1 ]] && { head -1 "$1"; return; }
    sleep 0.1
  done
  echo "no banner in $1" >&2
  cat "${1%.out}.err" >&2
  exit 1
}
field() { sed -e "s|.*$2||" -e "s|[$3].*||" <<<"$1"; }
BANNER=$(banner "$DIR/cloud.out")
# The edge dials a host name: the image's resolver reads the /etc/hosts the runtime mounts.
WEBSOCKET=localhost:$(field "$BANNER" "WebSocket on 127.0.0.1:" ",")
CERT_PORT=$(field "$BANNER" "certificates on https://127.0.0.1:" " ")
TOKEN=$(run -v "$DIR/cloud:/etc/kubeedge:ro" "$IMAGE" token --config /etc/kubeedge/cloudcore.yaml)

# join's defaults: /etc/kubeedge/config/edge.yaml, certificates and database in /etc/kubeedge.
run -i -v "$DIR/edge:/etc/kubeedge" "$IMAGE" join --cloud "$WEBSOCKET" --cert-port "$CERT_PORT" \
  --token-file - --node smoke-edge --admin 127.0.0.1:0 <<<"$TOKEN" >/dev/null
run --name "$NAME-edge" -v "$DIR/edge:/etc/kubeedge" "$IMAGE" edge \
  --config /etc/kubeedge/config/edge.yaml \
  >"$DIR/edge.out" 2>"$DIR/edge.err" &
banner "$DIR/edge.out" >/dev/null
DB=$(sed -n 's/^ *dataSource: *//p' "$DIR/edge/config/edge.yaml" | tr -d '"')
DB=$DIR/edge/${DB#/etc/kubeedge/}

stored() {
  python3 - "$DB" <<'PY'
import sqlite3, sys
try:
    print(sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM meta WHERE type = 'pod'").fetchone()[0])
except Exception:
    print(0)
PY
}
START=$(date +%s)
until [[ $(stored) -ge $PODS ]]; do
  if (($(date +%s) - START > 120)); then
    echo "only $(stored) of $PODS pods after 120 s" >&2
    cat "$DIR/cloud.err" "$DIR/edge.err" >&2
    exit 1
  fi
  sleep 0.2
done
for side in cloud edge; do
  echo "$side: user $($PODMAN inspect --format '{{.Config.User}}' "$NAME-$side")," \
    "process uid $(ps -o uid= -p "$($PODMAN inspect --format '{{.State.Pid}}' "$NAME-$side")" | tr -d ' ')," \
    "wrote: $(cd "$DIR/$side" && find . -type f -newer "$DIR/cloud/cloudcore.yaml" | sort | tr '\n' ' ')"
done
echo "ok: $IMAGE: the edge stored $PODS pods from the cloud; both read-only, without /tmp"
