#!/usr/bin/env bash
# Runs the control-plane load test at N agents against a fresh furnace-controller on loopback and
# writes the generator's JSON to bench/controlplane/results/N.json.
#   bench/controlplane/run.sh N [generator flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=$1
shift
dir=$(mktemp -d /tmp/furnace-cp-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
build/bin/furnace-controller --listen "127.0.0.1:$port" --state-dir "$dir/state" \
  --metrics-listen "" --log-level warn >"$dir/controller.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
mkdir -p bench/controlplane/results
build/bin/furnace_bench_controlplane --controller "127.0.0.1:$port" --controller-pid "$pid" \
  --agents "$n" "$@" | tee "bench/controlplane/results/$n.json"
