#!/usr/bin/env bash
# Weak and strong scaling of the demo model (configs/demo.yaml) over 1, 2, 4, 8 ranks on loopback
# Gloo, for DP layouts (dp=N) and EP layouts (dp=N, ep=N; ep <= E = 8), with bench_distributed.
#
#   weak:   every rank keeps B=8, m=2 (1024 tokens per rank per step): global batch grows with N;
#   strong: the global batch stays 16 sequences (1024 tokens) per step: m=2, B=8/N.
# One rank (N=1) is the same run for DP and EP and is run once per round. Every configuration runs
# once per round, --rounds rounds in the same order; speed-up = tokens/s(N) / tokens/s(1) of the SAME
# round (side by side), shown as median (min-max) over rounds. Each run also checks its bytes per
# collective against the analytical count; a mismatch (exit 3) stops the script loudly.
#
# THE MACHINE HAS 2 CORES: at 4 and 8 ranks the processes time-share them (one BLAS thread each),
# so the best possible weak-scaling speed-up is ~2 (compute-bound), not N, and strong scaling past
# 2 ranks can only lose. "of 2-core ideal" = speed-up / min(N, 2).
#
# Usage: bench/distributed/run_scaling.sh [--rounds 3] [--sizes "1 2 4 8"] [--steps 10]
#                                         [--warmup 3] [--bin DIR]
# --bin defaults to the first of build/bin, build-bench/bin, build-bench/bench that holds
# bench_distributed.
# Writes bench/results/<date>-distributed-scaling.md (commit, load, exact commands, tables) and the
# raw JSON of every run under bench/results/raw/<stamp>-scaling/.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"  # sets ROOT
ROUNDS=3
SIZES="1 2 4 8"
STEPS=10
WARMUP=3
BIN=""
bench_parse_flags "rounds=ROUNDS sizes=SIZES steps=STEPS warmup=WARMUP bin=BIN" "$@"
BIN_FLAG=""  # the report's command line repeats --bin when one was given
[[ -n "$BIN" ]] && BIN_FLAG=" --bin $BIN"
[[ -n "$BIN" ]] || BIN="$(bench_default_bin bench_distributed)"
EXE="$BIN/bench_distributed"
bench_require_exe "$EXE" "build it: cmake --build build --target bench_distributed"

bench_begin_results -scaling distributed-scaling

run() {  # run <name> <flags...>
  local name="$1"; shift
  local out="$RAW/$name"
  echo "$(bench_thread_env 1) ${EXE#"$ROOT"/} $* --steps $STEPS --warmup $WARMUP --json ${out#"$ROOT"/}.json" >> "$CMDLOG"
  local rc=0
  bench_pinned 1 "$EXE" "$@" --steps "$STEPS" --warmup "$WARMUP" --json "$out.json" > "$out.txt" 2> "$out.err" || rc=$?
  if [[ $rc -eq 3 ]]; then
    echo "*** $name: MEASURED AND ANALYTICAL BYTES DIFFER (see $out.txt) ***" >&2
    cat "$out.txt" >&2
    exit 3
  elif [[ $rc -ne 0 ]]; then
    echo "*** $name failed (exit $rc): $(tail -3 "$out.err")" >&2
    exit 1
  fi
}

for r in $(seq 1 "$ROUNDS"); do
  for mode in weak strong; do
    for n in $SIZES; do
      if [[ $mode == weak ]]; then b=8; else b=$((8 / n)); fi
      [[ $b -ge 1 ]] || { echo "strong scaling needs N <= 8" >&2; exit 2; }
      echo "round $r/$ROUNDS $mode N=$n (load $(cut -d' ' -f1 /proc/loadavg), $((SECONDS - T0)) s)" >&2
      if [[ $n -eq 1 ]]; then
        run "$mode-n1-r$r" --dp 1 --micro_batch "$b" --micro_batches 2
      else
        run "$mode-dp$n-r$r" --dp "$n" --micro_batch "$b" --micro_batches 2
        run "$mode-ep$n-r$r" --dp "$n" --ep "$n" --micro_batch "$b" --micro_batches 2
      fi
    done
  done
done
bench_end_runs

TABLE="$(/usr/bin/python3 - "$RAW" "$ROUNDS" "$SIZES" <<'EOF'
import json, statistics, sys
raw, rounds, sizes = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split()]
def load(mode, layout, n, r):
    name = "%s-n1-r%d" % (mode, r) if n == 1 else "%s-%s%d-r%d" % (mode, layout, n, r)
    return json.load(open("%s/%s.json" % (raw, name)))
def mmm(v, fmt):
    return "%s (%s-%s)" % (fmt % statistics.median(v), fmt % min(v), fmt % max(v))
for mode in ("weak", "strong"):
    print("#### %s scaling (%s)" % (mode, "B=8, m=2 per rank" if mode == "weak" else
                                     "16 sequences per step in all: m=2, B=8/N"))
    print()
    print("| layout | N | global tokens/step | step time ms | tokens/s (global) | speed-up vs N=1 "
          "| of 2-core ideal | sync ms | bytes/rank/step (all_reduce + all_to_all) | bytes match |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for layout in ("dp", "ep"):
        for n in sizes:
            runs = [load(mode, layout, n, r) for r in range(1, rounds + 1)]
            base = [load(mode, layout, 1, r) for r in range(1, rounds + 1)]
            tps = [x["tokens_per_s"]["median"] for x in runs]
            sp = [x["tokens_per_s"]["median"] / b["tokens_per_s"]["median"] for x, b in zip(runs, base)]
            ideal = min(n, 2) if mode == "weak" else 1
            ar = [statistics.mean(rk["bytes_per_step"][0] for rk in x["ranks"]) for x in runs]
            a2a = [statistics.mean(rk["bytes_per_step"][3] for rk in x["ranks"]) for x in runs]
            print("| %s | %d | %d | %s | %s | **%s** | %s | %s | %.0f + %.0f | %s |" % (
                "dp=%d" % n if layout == "dp" else "dp=ep=%d" % n, n, runs[0]["global_tokens_per_step"],
                mmm([x["step_s"]["median"] * 1e3 for x in runs], "%.0f"), mmm(tps, "%.0f"),
                mmm(sp, "%.2f"), mmm([s / ideal for s in sp], "%.2f"),
                mmm([x["sync_s"]["median"] * 1e3 for x in runs], "%.1f"),
                statistics.median(ar), statistics.median(a2a),
                "yes" if all(x["match"] for x in runs) else "**NO**"))
    print()
print("Each run: median over its %s timed steps of the slowest rank's step time; the table gives the "
      "median (min-max) over the %d rounds. Speed-up = tokens/s(N) / tokens/s(N=1) of the same round. "
      "2-core ideal: weak = min(N, 2), strong = 1 (N ranks share 2 cores)." %
      (load("weak", "dp", 1, 1)["steps"], rounds))
EOF
)"

{
  echo "# Distributed scaling of the demo model on loopback Gloo ($DATE)"
  echo
  bench_report_provenance " — ranks beyond 2 time-share the 2 cores"
  echo "- settings: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 for every rank; $WARMUP warm-up + $STEPS timed steps per run; $ROUNDS rounds; ${ELAPSED} s in all"
  echo "- model: configs/demo.yaml (V=64 T=64 d=64 h=4 L=4 E=8 k=2 f=128, every layer MoE, dropless)"
  echo "- command: \`bench/distributed/run_scaling.sh --rounds $ROUNDS --sizes \"$SIZES\" --steps $STEPS --warmup $WARMUP$BIN_FLAG\`"
  echo "- raw JSON and text of every run: bench/results/raw/$STAMP-scaling/"
} > "$OUTMD"
bench_finish_report "$TABLE" "Exact per-run commands (from the repository root, in the order run):" " ($ELAPSED s)"
