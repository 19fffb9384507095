#!/usr/bin/env bash
# Runs the control-plane load test at N agents against a fresh furnace-controller on loopback,
# with mutual TLS and tokens as a cluster runs it (a development CA from `furnace certs init`):
# the controller gets --tls-cert/--tls-key/--tls-ca, --token-file and --join-token-file, the
# generator the worker certificate, the join token and an admin token.
#   bench/controlplane/run.sh N [--plaintext] [--nice K] [--pin] [--worker-timeout S]
#                               [--telemetry-flush S] [--channels C] [flags...]
# --plaintext: no TLS and no tokens (for the ratio). --nice K: run the controller and the generator
# at nice K (e.g. -5: ahead of other people's builds on a shared machine). --pin: the controller on
# CPU 0, the generator on CPU 1 (taskset), so they do not take each other's core.
# --telemetry-flush S: the controller's (told to the agents; default 0.2 s). --channels C: the
# HTTP/2 connections the simulated agents share (the generator's; default 8). The results' names
# say which. Other flags go to the generator. Writes the generator's JSON to
# bench/controlplane/results/N-<commit>[-plaintext].json and `uptime` before and after (the load
# of the shared machine) to the same name with .load; prints the JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=$1
shift
tls=1
timeout_s=10
nice_k=0
pin=0
flush=""
channels=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --plaintext) tls=0 ;;
    --nice) nice_k=$2; shift ;;
    --pin) pin=1 ;;
    --worker-timeout) timeout_s=$2; shift ;;
    --telemetry-flush) flush=$2; shift ;;
    --channels) channels=$2; args+=(--channels "$2"); shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
dir=$(mktemp -d /tmp/furnace-cp-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctl=(--listen "127.0.0.1:$port" --state-dir "$dir/state" --metrics-listen "" --log-level warn
     --worker-timeout "$timeout_s")
[ -z "$flush" ] || ctl+=(--telemetry-flush "$flush")
gen=(--controller "127.0.0.1:$port" --agents "$n" --worker-timeout "$timeout_s")
if [ "$tls" = 1 ]; then
  build/bin/furnace certs init "$dir/tls" >/dev/null
  t="$dir/tls"
  ctl+=(--tls-cert "$t/controller.pem" --tls-key "$t/controller.key" --tls-ca "$t/ca.pem"
        --token-file "$t/tokens" --join-token-file "$t/join.token")
  gen+=(--tls-ca "$t/ca.pem" --tls-cert "$t/worker.pem" --tls-key "$t/worker.key"
        --join-token-file "$t/join.token" --token-file "$t/admin.token")
fi
cpu_ctl=(); cpu_gen=()
if [ "$pin" = 1 ]; then cpu_ctl=(taskset -c 0); cpu_gen=(taskset -c 1); fi
nice -n "$nice_k" "${cpu_ctl[@]}" build/bin/furnace-controller "${ctl[@]}" >"$dir/controller.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; tail -5 "$dir/controller.log" >&2; rm -rf "$dir"' EXIT
sleep 1
mkdir -p bench/controlplane/results
name="bench/controlplane/results/$n-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ":!bench/controlplane/results" || echo -dirty)$([ "$tls" = 1 ] || echo -plaintext)$([ "$nice_k" = 0 ] || echo "-nice$nice_k")$([ "$pin" = 0 ] || echo -pinned)$([ -z "$channels" ] || echo "-ch$channels")$([ -z "$flush" ] || echo "-flush$flush")"
# A repeated run gets its own name (-run2, -run3, ...), never another run's files.
if [ -e "$name.json" ]; then
  k=2
  while [ -e "$name-run$k.json" ]; do k=$((k + 1)); done
  name="$name-run$k"
fi
uptime >"$name.load"
rc=0
nice -n "$nice_k" "${cpu_gen[@]}" build/bin/furnace_bench_controlplane "${gen[@]}" --controller-pid "$pid" "${args[@]}" \
  >"$name.json" || rc=$?
cat "$name.json"
uptime >>"$name.load"
# The silence the controller itself measured when it declared each silent agent lost (its log:
# "worker ID lost: no heartbeat for S s"), without the generator's polling of ListWorkers.
python3 - "$name.json" "$dir/controller.log" >"$name.lost" <<'PY' || true
import json, re, sys
ids = set(json.load(open(sys.argv[1]))["loss"]["workers"])
for line in open(sys.argv[2], errors="replace"):
    m = re.search(r"worker (\S+) lost: no heartbeat for ([0-9.]+) s", line)
    if m and m.group(1) in ids:
        print(m.group(1), m.group(2))
PY
exit $rc
