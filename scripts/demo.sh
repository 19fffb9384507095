#!/usr/bin/env bash
# Quick start, first command: installs what is missing, builds, starts a local controller with
# 4 local worker daemons (--workers N), trains the demo model (configs/demo.yaml: a small GPT-MoE
# learning a Markov chain to near its entropy floor, on 4 ranks with expert parallelism) to the end
# with live progress, prints its status, and stops everything. `--job configs/commcheck.yaml` runs the cluster health check instead.
#
# Usage: scripts/demo.sh [--port N] [--metrics-port N] [--workers N] [--job FILE] [--keep]
#   --port          the controller's gRPC port (default 7070)
#   --metrics-port  its /metrics and dashboard port (default 9464)
#   --workers       local workers to start (default 4; a job needs one per rank, pp * dp * tp:
#                   --workers 8 --job configs/layouts/tp2_pp2_ep2_esp2.yaml)
#   --keep          leave the controller and workers running afterwards (stop with: kill <pid>)
set -euo pipefail
port=7070
metrics_port=9464
job=configs/demo.yaml
workers=4
keep=0
usage="allowed: --port N, --metrics-port N, --workers N, --job FILE, --keep"
while [ $# -gt 0 ]; do
  case "$1" in
    --port|--metrics-port|--workers|--job)
      [ $# -ge 2 ] || { echo "demo.sh: $1 needs a value ($usage)" >&2; exit 2; }
      case "$1" in
        --port) port="$2" ;;
        --metrics-port) metrics_port="$2" ;;
        --workers)
          case "$2" in
            ''|*[!0-9]*|0) echo "demo.sh: --workers '$2': allowed: a whole number of workers, 1 or more" >&2; exit 2 ;;
          esac
          workers="$2" ;;
        # A job file is named from where the script was called, not the repository root.
        --job) job="$(realpath -m -- "$2")" ;;
      esac
      shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."

scripts/setup.sh
scripts/build.sh

state=demo-state
mkdir -p "$state"
addr="127.0.0.1:$port"
furnace=(build/bin/furnace --controller "$addr")
echo "[demo] starting furnace-controller on $addr with $workers local workers (state in $state/)"
build/bin/furnace-controller --listen "$addr" --state-dir "$state" --local-workers "$workers" \
  --metrics-listen "127.0.0.1:$metrics_port" >>"$state/controller.log" 2>&1 &
controller=$!
cleanup() {
  if [ "$keep" = 0 ] && kill -0 "$controller" 2>/dev/null; then
    echo "[demo] stopping the controller and its workers"
    kill -TERM "$controller"
    wait "$controller" || true
  fi
}
trap cleanup EXIT

# Ready when this controller (not one left on the port by an earlier run) sees its workers.
ready=0
for _ in $(seq 1 150); do
  if ! kill -0 "$controller" 2>/dev/null; then
    echo "[demo] the controller exited; its log:" >&2
    tail -20 "$state/controller.log" >&2
    exit 1
  fi
  ready=$("${furnace[@]}" --json workers 2>/dev/null | python3 -c \
    'import json,sys; print(sum(w.get("state") in ("ready", "WORKER_STATE_READY") for w in json.load(sys.stdin).get("workers", [])))' \
    2>/dev/null || echo 0)
  [ "${ready:-0}" -ge "$workers" ] && kill -0 "$controller" 2>/dev/null && break
  sleep 0.2
done
if [ "${ready:-0}" -lt "$workers" ] || ! kill -0 "$controller" 2>/dev/null; then
  echo "[demo] the controller on $addr did not get its $workers workers ready in 30 s; its log:" >&2
  tail -20 "$state/controller.log" >&2
  exit 1
fi
"${furnace[@]}" workers

jobs_count() {
  "${furnace[@]}" --json jobs | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))'
}
before=$(jobs_count)
rc=0
"${furnace[@]}" submit "$job" --watch || rc=$?
# Its status, unless the submission made no job (refused: the reason is printed above).
if [ "$(jobs_count)" -gt "$before" ]; then
  job_id=$("${furnace[@]}" --json jobs | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][-1]["job_id"])')
  "${furnace[@]}" status "$job_id"
fi
[ "$keep" = 1 ] && echo "[demo] controller left running (pid $controller) on $addr"
exit $rc
