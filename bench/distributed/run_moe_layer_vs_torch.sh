#!/usr/bin/env bash
# The expert-parallel MoE layer, Furnace vs PyTorch, forward + backward, A B A B.
#
# For each EP size, runs bench_moe_layer (ours) then bench/distributed/moe_layer_torch.py
# (PyTorch 1.13, all_to_all_single over gloo), alternating, --pairs times, each a fresh set of
# processes (one per EP rank) with OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 set
# before they start and one BLAS / torch thread per rank. Shape: BENCHMARKING.md's MoE (d=256 E=8
# k=2 f=512 T=128 b=8 per rank). Ratio = ours / theirs of the median fwd+bwd time (slowest rank per
# repetition) of the two runs of one pair: below 1 means ours is faster. The table gives the
# median (min-max) over pairs. Writes bench/results/<date>-moe-layer-vs-torch.md (commit, load,
# exact commands, table) and the raw JSON under bench/results/raw/<stamp>-moe-layer/.
#
# THE MACHINE HAS 2 CORES: ep=4 runs 4 processes on them (both sides alike).
#
# Usage: bench/distributed/run_moe_layer_vs_torch.sh [--pairs 3] [--eps "1 2 4"] [--reps 20]
#                                                    [--warmup 3] [--bin DIR]
# --bin defaults to the first of build/bin, build-bench/bin, build-bench/bench that holds
# bench_moe_layer. Needs torch for /usr/bin/python3 (Debian: sudo apt-get install -y python3-torch);
# checked before the first run.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"  # sets ROOT
PAIRS=3
EPS="1 2 4"
REPS=20
WARMUP=3
BIN=""
bench_parse_flags "pairs=PAIRS eps=EPS reps=REPS warmup=WARMUP bin=BIN" "$@"
BIN_FLAG=""  # the report's command line repeats --bin when one was given
[[ -n "$BIN" ]] && BIN_FLAG=" --bin $BIN"
[[ -n "$BIN" ]] || BIN="$(bench_default_bin bench_moe_layer)"
OURS="$BIN/bench_moe_layer"
PEER="$ROOT/bench/distributed/moe_layer_torch.py"
bench_require_exe "$OURS" "build it: cmake --build build --target bench_moe_layer"
bench_require_torch /usr/bin/python3

bench_begin_results -moe-layer moe-layer-vs-torch

run() {  # run <outfile> <cmd...>
  local out="$1"; shift
  echo "$(bench_thread_env 1) ${*//"$ROOT"\//}" >> "$CMDLOG"
  bench_pinned 1 "$@" > "$out" 2> "$out.err" || {
    echo "*** failed: $* (see $out.err)" >&2; tail -5 "$out.err" >&2; exit 1; }
}

for ep in $EPS; do
  for p in $(seq 1 "$PAIRS"); do
    echo "ep=$ep pair $p/$PAIRS (load $(cut -d' ' -f1 /proc/loadavg), $((SECONDS - T0)) s)" >&2
    run "$RAW/ep$ep-p$p-ours.json" "$OURS" --ep "$ep" --reps "$REPS" --warmup "$WARMUP" --threads 1
    run "$RAW/ep$ep-p$p-torch.json" /usr/bin/python3 "$PEER" --ep "$ep" --reps "$REPS" \
      --warmup "$WARMUP" --threads 1
  done
done
bench_end_runs

TABLE="$(/usr/bin/python3 - "$RAW" "$PAIRS" "$EPS" <<'EOF'
import json, statistics, sys
raw, pairs, eps = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def mmm(v, fmt):
    return "%s (%s-%s)" % (fmt % statistics.median(v), fmt % min(v), fmt % max(v))
print("| ep | ours fwd+bwd ms | torch fwd+bwd ms | **ratio ours/torch fwd+bwd** | ratio fwd | ratio bwd |")
print("|---|---|---|---|---|---|")
for ep in eps:
    o = [json.load(open("%s/ep%s-p%d-ours.json" % (raw, ep, p))) for p in range(1, pairs + 1)]
    t = [json.load(open("%s/ep%s-p%d-torch.json" % (raw, ep, p))) for p in range(1, pairs + 1)]
    def ratio(key):
        return [a[key]["median"] / b[key]["median"] for a, b in zip(o, t)]
    print("| %s | %s | %s | **%s** | %s | %s |" % (
        ep, mmm([a["fwd_bwd_s"]["median"] * 1e3 for a in o], "%.1f"),
        mmm([b["fwd_bwd_s"]["median"] * 1e3 for b in t], "%.1f"),
        mmm(ratio("fwd_bwd_s"), "%.2f"), mmm(ratio("fwd_s"), "%.2f"), mmm(ratio("bwd_s"), "%.2f")))
print()
print("Per run: median over its timed repetitions of the slowest rank's time; the table gives the "
      "median (min-max) over the %d A B pairs. Ratio < 1: ours faster." % pairs)
EOF
)"

{
  echo "# Expert-parallel MoE layer, Furnace vs PyTorch ($DATE)"
  echo
  bench_report_provenance " — ep=4 time-shares the 2 cores"
  echo "- torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) (Debian python3-torch, gloo)"
  echo "- settings: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000, one thread per rank, both sides; $WARMUP warm-up + $REPS timed repetitions per run; $PAIRS A B pairs (ours first); ${ELAPSED} s in all"
  echo "- shape: d=256 E=8 k=2 f=512 T=128 b=8 per rank (N=1024 tokens, 2048 routed rows per rank), dropless, aux alpha 0.01"
  echo "- command: \`bench/distributed/run_moe_layer_vs_torch.sh --pairs $PAIRS --eps \"$EPS\" --reps $REPS --warmup $WARMUP$BIN_FLAG\`"
  echo "- raw JSON: bench/results/raw/$STAMP-moe-layer/"
} > "$OUTMD"
bench_finish_report "$TABLE" "Exact per-run commands (from the repository root, in the order run):" " ($ELAPSED s)"
