#!/usr/bin/env bash
# Quick start, first command: installs what is missing, builds, starts a local controller with
# 4 local worker daemons, trains the demo model (configs/demo.yaml: a small GPT-MoE learning a
# Markov chain to near its entropy floor, on 4 ranks with expert parallelism) to the end with live
# progress, prints its status, and stops everything. `--job configs/commcheck.yaml` runs the cluster health check instead.
#
# Usage: scripts/demo.sh [--port N] [--job FILE] [--keep]
#   --keep   leave the controller and workers running afterwards (stop with: kill <pid>)
set -euo pipefail
cd "$(dirname "$0")/.."
port=7070
job=configs/demo.yaml
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --job) job="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' (allowed: --port N, --job FILE, --keep)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh
scripts/build.sh

state=demo-state
mkdir -p "$state"
addr="127.0.0.1:$port"
furnace=(build/bin/furnace --controller "$addr")
echo "[demo] starting furnace-controller on $addr with 4 local workers (state in $state/)"
build/bin/furnace-controller --listen "$addr" --state-dir "$state" --local-workers 4 \
  >>"$state/controller.log" 2>&1 &
controller=$!
cleanup() {
  if [ "$keep" = 0 ] && kill -0 "$controller" 2>/dev/null; then
    echo "[demo] stopping the controller and its workers"
    kill -TERM "$controller"
    wait "$controller" || true
  fi
}
trap cleanup EXIT

for _ in $(seq 1 150); do
  ready=$("${furnace[@]}" --json workers 2>/dev/null | python3 -c \
    'import json,sys; print(sum(w.get("state") in ("ready", "WORKER_STATE_READY") for w in json.load(sys.stdin).get("workers", [])))' \
    2>/dev/null || echo 0)
  [ "${ready:-0}" -ge 4 ] && break
  if ! kill -0 "$controller" 2>/dev/null; then
    echo "[demo] the controller exited; its log:" >&2
    tail -20 "$state/controller.log" >&2
    exit 1
  fi
  sleep 0.2
done
"${furnace[@]}" workers

rc=0
"${furnace[@]}" submit "$job" --watch || rc=$?
job_id=$("${furnace[@]}" --json jobs | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][-1]["job_id"])')
"${furnace[@]}" status "$job_id"
[ "$keep" = 1 ] && echo "[demo] controller left running (pid $controller) on $addr"
exit $rc
