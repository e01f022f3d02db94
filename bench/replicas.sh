#!/usr/bin/env bash
# Three `edgehive cloud` replicas on one stand-in API server (`edgehive cluster`) share a TLS
# fleet from several `edgehive-loadtest` processes (cluster mode: changes written at the API
# server, the CA read from kubeedge/casecret). While pod changes flow, one replica is killed
# with SIGKILL; its edges dial the others of their list, each from its own place (they spread). Prints one JSON line: how long
# until every dropped edge was connected to a live replica and had every change written to it
# before it came back, the stand-in's write requests per second meanwhile, and what was lost.
#
#   cargo build -p edgehive && cargo build -p edgehive-loadtest     # or --release, then BIN=release
#   bench/replicas.sh EDGES
#   BIN=release TOOLS=4 bench/replicas.sh 20000
#
# EDGES: the whole fleet. TOOLS: tool processes (default: one per 10,000 edges, at least 2),
# each with EDGES/TOOLS edges named rT-N over the three replicas (this machine allows 20,000
# open files per process). RATE: pod changes per second per tool (default 50), for
# SECONDS_OF_CHANGES (default 60) in all; CLAIMS: each replica's nodeLeaseWritesPerSecond
# (unset: the product's default, 300); the kill comes KILL_AFTER seconds (default 15) after the changes begin.
# Replicas use the default Lease settings (15 s lease, 10 s renew deadline, 2 s period).
# Bounded: every wait has a deadline; the whole run ends within SECONDS + about 4 minutes.
set -euo pipefail
edges=${1:?edges}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/${BIN:-debug}
tools=${TOOLS:-$(((edges + 9999) / 10000))}
[ "$tools" -ge 2 ] || tools=2
rate=${RATE:-50}
seconds=${SECONDS_OF_CHANGES:-60}
kill_after=${KILL_AFTER:-15}
ulimit -Sn "$(ulimit -Hn)"
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
now_ms() { date +%s%3N; }

# The stand-in API server.
"$bin/edgehive" cluster --listen 127.0.0.1:0 --data-dir "$work/standin" \
  --kubeconfig-out "$work/kubeconfig" > "$work/standin.out" 2> "$work/standin.err" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/standin.out" ] && break; sleep 0.1; done
api=$(sed -n 's/.*Kubernetes API on https:\/\/\([^ ,]*\),.*/\1/p' "$work/standin.out" | head -1)
[ -n "$api" ] || { echo "the stand-in did not start: $(cat "$work/standin.err")" >&2; exit 1; }
token=$(cat "$work/standin/token")
# Write requests the stand-in has received so far (POST + PUT + PATCH + DELETE); nothing
# when it did not answer in 2 s.
writes() {
  local metrics
  metrics=$(curl -sfk --max-time 2 -H "Authorization: Bearer $token" "https://$api/metrics") || return 0
  awk '/^edgehive_standin_requests_total\{verb="(POST|PUT|PATCH|DELETE)"\}/ {s += $2} END {print s + 0}' <<<"$metrics"
}

# Three replicas; the first makes the CA and publishes it, the others adopt it from the Secret.
per_replica=$((edges / 3 + 1000))
clouds=()
cloud_pids=()
for r in 1 2 3; do
  dir=$work/replica-$r
  mkdir -p "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  cat > "$dir/cloud.yaml" <<YAML
kubeAPIConfig:
  kubeConfig: $work/kubeconfig
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
modules:
  cloudHub:
    nodeLimit: $((edges + 1000))
    handshakesPerSource: 64
    websocket:
      address: 127.0.0.1
      port: $port
    https:
      address: 127.0.0.1
      port: 0
    tlsCAFile: $dir/pki/ca.crt
    tlsCAKeyFile: $dir/pki/ca.key
    tlsCertFile: $dir/pki/server.crt
    tlsPrivateKeyFile: $dir/pki/server.key
    replica:
      enable: true
      identity: replica-$r
      address: 127.0.0.1:$port
      forwardPort: 0
${CLAIMS:+      nodeLeaseWritesPerSecond: $CLAIMS}
YAML
  "$bin/edgehive" cloud --config "$dir/cloud.yaml" > "$dir/out" 2> "$dir/err" &
  cloud_pids+=($!)
  pids+=($!)
  for _ in $(seq 600); do [ -s "$dir/out" ] && break; sleep 0.1; done
  [ -s "$dir/out" ] || { echo "replica $r did not start: $(tail -5 "$dir/err")" >&2; exit 1; }
  clouds+=("127.0.0.1:$port")
done
# The CA the fleet's certificates come from, as cloudcore keeps it.
for _ in $(seq 300); do
  curl -sfk --max-time 5 -H "Authorization: Bearer $token" -o /dev/null \
    "https://$api/api/v1/namespaces/kubeedge/secrets/casecret" && break
  sleep 0.2
done
echo "replicas on ${clouds[*]} (about $per_replica edges each at most), stand-in on $api" >&2

cloud_list=$(IFS=,; echo "${clouds[*]}")
changes=$((rate * seconds))
tool_pids=()
for t in $(seq "$tools"); do
  "$bin/edgehive-loadtest" --cloud "$cloud_list" --kubeconfig "$work/kubeconfig" --ca-from-secret \
    --scenario fanout --edges $((edges / tools)) --prefix "r$t-" --rate "$rate" \
    --changes "$changes" --heartbeat 15 --concurrency $((64 / tools)) \
    > "$work/tool-$t.json" 2> "$work/tool-$t.err" &
  tool_pids+=($!)
  pids+=($!)
done

# Kill when every tool is writing changes (its fleet connected), KILL_AFTER seconds later.
deadline=$(($(date +%s) + 600))
until [ "$(grep -l 'changes or requests sent' "$work"/tool-*.err 2>/dev/null | wc -l)" -ge "$tools" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "the fleets did not connect in 600 s" >&2; tail -n 3 "$work"/tool-*.err >&2; exit 1; }
  for p in "${tool_pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a tool exited early" >&2; tail -n 5 "$work"/tool-*.err >&2; exit 1; }; done
  sleep 1
done
sleep "$kill_after"
victim=${cloud_pids[1]}
kill_ms=$(now_ms)
kill -9 "$victim"
echo "killed replica-2 (pid $victim) at $kill_ms" >&2
# The stand-in's write counter every second until the tools end.
(
  while :; do
    t=$(now_ms) w=$(writes)
    [ -z "$w" ] || echo "$t $w"
    sleep 1
  done
) > "$work/writes.txt" &
sampler=$!
pids+=($sampler)
for p in "${tool_pids[@]}"; do wait "$p" || true; done
kill "$sampler" 2>/dev/null || true
cat "$work"/tool-*.json >&2
echo "stand-in writes (unix ms, total) after the kill:" >&2
cat "$work/writes.txt" >&2
python3 - "$kill_ms" "$edges" "$tools" "$rate" "$work/writes.txt" "$work"/tool-*.json <<'PY'
import json, sys
kill_ms, edges, tools, rate = (int(x) for x in sys.argv[1:5])
samples = [tuple(map(int, line.split())) for line in open(sys.argv[5]) if len(line.split()) == 2]
reports = [json.loads(open(path).readline()) for path in sys.argv[6:]]
fail = [r.get("failover") for r in reports]
dropped = sum(f["edgesDropped"] for f in fail if f)
not_back = sum(f["notBack"] for f in fail if f)
not_caught_up = sum(f["notCaughtUp"] for f in fail if f)
back = max((f["lastBackUnixMs"] for f in fail if f), default=kill_ms)
caught = max((f["lastCaughtUpUnixMs"] for f in fail if f), default=kill_ms)
changes = [r["changes"] for r in reports]
# The stand-in's writes per second from the kill until every dropped edge was caught up.
window = [s for s in samples if s[0] <= max(caught, kill_ms) + 1000]
def rate_between(a, b):
    return (b[1] - a[1]) / ((b[0] - a[0]) / 1000) if b[0] > a[0] else 0.0
per_second = [rate_between(a, b) for a, b in zip(samples, samples[1:])]
print(json.dumps({
    "edges": edges, "tools": tools, "replicas": 3, "tls": all(r["tls"] for r in reports),
    "connectedBeforeKill": sum(r["connected"] for r in reports),
    "connectedAtEnd": sum(r["connectedAtEnd"] for r in reports),
    "edgesDropped": dropped, "notBack": not_back, "notCaughtUp": not_caught_up,
    "secondsFromKillToAllBack": round((back - kill_ms) / 1000, 1),
    "secondsFromKillToAllCaughtUp": round((caught - kill_ms) / 1000, 1),
    "changesWritten": sum(c["written"] for c in changes),
    "podsWithTheirLastVersion": sum(c["finalVersionsDelivered"] for c in changes),
    "pods": sum(c["pods"] for c in changes),
    "changeRatePerSecond": rate * tools,
    "standinWritesPerSecondKillToCaughtUp": round(rate_between(window[0], window[-1]), 1) if len(window) > 1 else None,
    "standinWritesPerSecondPeak": round(max(per_second), 1) if per_second else None,
    "latencyMsP99Max": max(c["latencyMsP99"] for c in changes),
    "machine": reports[0].get("machine"),
}))
PY
