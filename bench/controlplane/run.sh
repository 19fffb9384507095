#!/usr/bin/env bash
# Runs the control-plane load test at N agents against a fresh furnace-controller on loopback,
# with mutual TLS and tokens as a cluster runs it (a development CA from `furnace certs init`):
# the controller gets --tls-cert/--tls-key/--tls-ca, --token-file and --join-token-file, the
# generator the worker certificate, the join token and an admin token.
#   bench/controlplane/run.sh N [--plaintext] [--worker-timeout S] [generator flags...]
# --plaintext: no TLS and no tokens (for the ratio). Writes the generator's JSON to
# bench/controlplane/results/N-<commit>[-plaintext].json and `uptime` before and after (the load
# of the shared machine) to the same name with .load; prints the JSON.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=$1
shift
tls=1
timeout_s=10
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --plaintext) tls=0 ;;
    --worker-timeout) timeout_s=$2; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
dir=$(mktemp -d /tmp/furnace-cp-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctl=(--listen "127.0.0.1:$port" --state-dir "$dir/state" --metrics-listen "" --log-level warn
     --worker-timeout "$timeout_s")
gen=(--controller "127.0.0.1:$port" --agents "$n" --worker-timeout "$timeout_s")
if [ "$tls" = 1 ]; then
  build/bin/furnace certs init "$dir/tls" >/dev/null
  t="$dir/tls"
  ctl+=(--tls-cert "$t/controller.pem" --tls-key "$t/controller.key" --tls-ca "$t/ca.pem"
        --token-file "$t/tokens" --join-token-file "$t/join.token")
  gen+=(--tls-ca "$t/ca.pem" --tls-cert "$t/worker.pem" --tls-key "$t/worker.key"
        --join-token-file "$t/join.token" --token-file "$t/admin.token")
fi
build/bin/furnace-controller "${ctl[@]}" >"$dir/controller.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; tail -5 "$dir/controller.log" >&2; rm -rf "$dir"' EXIT
sleep 1
mkdir -p bench/controlplane/results
name="bench/controlplane/results/$n-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ":!bench/controlplane/results" || echo -dirty)$([ "$tls" = 1 ] || echo -plaintext)"
uptime >"$name.load"
build/bin/furnace_bench_controlplane "${gen[@]}" --controller-pid "$pid" "${args[@]}" |
  tee "$name.json"
uptime >>"$name.load"
