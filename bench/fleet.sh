#!/usr/bin/env bash
# A scenario of `edgehive-loadtest` against one `edgehive cloud` (mutual TLS on loopback, the
# embedded cluster in a SQLite file): prints the tool's JSON line and its markdown row.
#
#   cargo build --release -p edgehive && cargo build --release -p edgehive-loadtest
#   bench/fleet.sh SCENARIO EDGES [edgehive-loadtest arguments...]
#   bench/fleet.sh fanout 1000 --rate 1000 --changes 30000
#   bench/fleet.sh storm 10000
#   TOOLS=2 bench/fleet.sh hold 19900   # the fleet split over 2 tool processes
#
# TOOLS (hold only, default 1): tool processes, each with EDGES/TOOLS edges (named
# load-T-N): one process may hold 20,000 open files here, and the cloud needs one per edge,
# so a fleet near that limit needs its edges split. A last JSON line then sums the tools.
#
# The tool creates the fleet's Nodes and writes the changes through the cloud's admin endpoint.
set -euo pipefail
scenario=${1:?scenario: hold, fanout or storm}
edges=${2:?edges}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
# The cloud and the tool are built apart (two commands above): built in one, the cloud would
# have the tool's test hooks.
# LOADTEST: the load tool's binary. EDGEHIVE: an older `edgehive` whose `loadtest` command is
# the tool (builds from before the tool had a crate of its own), and the cloud's by default.
# CLOUD_EDGEHIVE: the cloud's binary (an older build to compare).
if [ -n "${EDGEHIVE:-}" ]; then
  tool=("$EDGEHIVE" loadtest)
else
  tool=("${LOADTEST:-$root/target/release/edgehive-loadtest}")
fi
cloud_bin=${CLOUD_EDGEHIVE:-${EDGEHIVE:-$root/target/release/edgehive}}
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
tools=${TOOLS:-1}
if [ "$tools" -le 1 ]; then
  "${tool[@]}" --cloud "$websocket" --admin "$admin" --edges "$edges" --scenario "$scenario" \
    --heartbeat 15 --concurrency 64 --ca-cert "$work/ca/rootCA.crt" --ca-key "$work/ca/rootCA.key" \
    --cloud-pid "$cloud" --markdown "$@"
  exit
fi
[ "$scenario" = hold ] || { echo "TOOLS > 1 is for the hold scenario" >&2; exit 1; }
tool_pids=()
for t in $(seq "$tools"); do
  "${tool[@]}" --cloud "$websocket" --edges $((edges / tools)) --prefix "load-$t-" \
    --scenario hold --heartbeat 15 --concurrency $((64 / tools)) \
    --ca-cert "$work/ca/rootCA.crt" --ca-key "$work/ca/rootCA.key" --cloud-pid "$cloud" "$@" \
    > "$work/tool-$t.json" 2> "$work/tool-$t.err" &
  tool_pids+=($!)
done
for pid in "${tool_pids[@]}"; do wait "$pid"; done
cat "$work"/tool-*.json
# The first tool to finish sampled the cloud while every fleet was still connected.
python3 - "$work"/tool-*.json <<'PY'
import json, sys
reports = [json.loads(open(path).readline()) for path in sys.argv[1:]]
connected = sum(r["connected"] for r in reports)
first = min(reports, key=lambda r: r["connectSeconds"] + r["holdSeconds"])
rss, base = first["cloudRssKib"], min(r["cloudBaseRssKib"] for r in reports)
print(json.dumps({
    "tools": len(reports), "edges": sum(r["edges"] for r in reports), "connected": connected,
    "connectedAtEnd": sum(r["connectedAtEnd"] for r in reports),
    "failed": sum(r["failed"] for r in reports), "tls": first["tls"],
    "cloudCpuPercent": sum(r["cloudCpuPercent"] for r in reports) / len(reports),
    "toolCpuPercent": sum(r["toolCpuPercent"] for r in reports),
    "cloudRssKib": rss, "cloudBaseRssKib": base,
    "cloudRssKibPerEdge": rss / connected,
    "cloudRssKibPerEdgeAboveBase": (rss - base) / connected,
    "machine": first.get("machine"),
}))
PY
