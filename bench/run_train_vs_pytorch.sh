#!/usr/bin/env bash
# Furnace vs PyTorch eager, whole training steps, same CPU, same thread settings, A B A B.
#
# For each thread count and config, runs furnace_bench_train then bench/pytorch/moe_train_bench.py,
# alternating, --pairs times, with OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = threads and
# GOMP_SPINCOUNT=1000 set before each process starts (BENCHMARKING.md). Each side measures its own
# SGEMM peak in-process. Prints a markdown table (ratio ours/theirs of tokens/s per pair: median
# (min-max); MFU of each) and writes it, with the commit, load average and exact commands, to
# bench/results/<date>-train.md. Raw JSON of every run goes to bench/results/raw/<stamp>/.
#
# Usage: bench/run_train_vs_pytorch.sh [--pairs 3] [--threads "1 2"] [--configs "demo bench"]
#                                      [--steps 10] [--warmup 3]
#                                      [--bin DIR (default: the first of build/bin, build-bench/bin,
#                                       build-bench/bench that holds furnace_bench_train)]
# Needs torch for /usr/bin/python3 (Debian: sudo apt-get install -y python3-torch); checked first.
# Configs: demo  = configs/demo.yaml's model dims (V=64 T=64 d=64 h=4 L=4 E=8 k=2 f=128), b=8 m=2
#                  on one rank (configs/demo.yaml itself now runs b=4 m=2 on 4 ranks)
#          bench = BENCHMARKING.md's (V=256 T=128 d=256 h=4 L=4 E=8 k=2 f=512, b=8 m=1)
# PyTorch has no micro-batches: it gets batch = b*m (the same tokens per optimizer step, in one
# larger batch, which if anything favours it).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"  # sets ROOT
PAIRS=3
THREADS="1 2"
CONFIGS="demo bench"
STEPS=10
WARMUP=3
BIN=""
bench_parse_flags "pairs=PAIRS threads=THREADS configs=CONFIGS steps=STEPS warmup=WARMUP bin=BIN" "$@"
BIN_FLAG=""  # the report's command line repeats --bin when one was given
[[ -n "$BIN" ]] && BIN_FLAG=" --bin $BIN"
[[ -n "$BIN" ]] || BIN="$(bench_default_bin furnace_bench_train)"
OURS="$BIN/furnace_bench_train"
PEER="$ROOT/bench/pytorch/moe_train_bench.py"
bench_require_exe "$OURS" "build it: cmake --build build --target furnace_bench_train"
bench_require_torch /usr/bin/python3

# name -> "our flags|pytorch --config"
declare -A CFG
CFG[demo]="--vocab 64 --seq_len 64 --d_model 64 --heads 4 --layers 4 --experts 8 --top_k 2 --expert_ffn 128 --micro_batch 8 --micro_batches 2|vocab=64,seq_len=64,d_model=64,heads=4,layers=4,experts=8,top_k=2,expert_ffn=128,batch=16"
CFG[bench]="--vocab 256 --seq_len 128 --d_model 256 --heads 4 --layers 4 --experts 8 --top_k 2 --expert_ffn 512 --micro_batch 8 --micro_batches 1|vocab=256,seq_len=128,d_model=256,heads=4,layers=4,experts=8,top_k=2,expert_ffn=512,batch=8"

bench_begin_results "" train full

run() {  # run <outfile> <threads> <cmd...>: env pinned before the process starts
  local out="$1" t="$2"; shift 2
  echo "$(bench_thread_env "$t") $*" >> "$CMDLOG"
  bench_pinned "$t" "$@" > "$out" 2> "$out.err"
}

for t in $THREADS; do
  for c in $CONFIGS; do
    ours_flags="${CFG[$c]%%|*}"
    peer_cfg="${CFG[$c]##*|}"
    for p in $(seq 1 "$PAIRS"); do
      echo "threads=$t config=$c pair $p/$PAIRS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
      # shellcheck disable=SC2086
      run "$RAW/$c-t$t-p$p-ours.json" "$t" "$OURS" $ours_flags --threads "$t" \
        --steps "$STEPS" --warmup "$WARMUP"
      run "$RAW/$c-t$t-p$p-torch.json" "$t" /usr/bin/python3 "$PEER" --threads "$t" \
        --config "$peer_cfg" --steps "$STEPS" --warmup "$WARMUP"
    done
  done
done
bench_end_runs

TABLE="$(/usr/bin/python3 - "$RAW" "$PAIRS" "$THREADS" "$CONFIGS" <<'EOF'
import json, statistics, sys
raw, pairs, threads, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def mmm(v, fmt):
    return "%s (%s-%s)" % (fmt % statistics.median(v), fmt % min(v), fmt % max(v))
rows = ["| config | threads | ours tok/s | torch tok/s | ratio ours/torch | MFU ours | MFU torch | SGEMM GFLOP/s ours / torch | FLOPs/token ours = torch |",
        "|---|---|---|---|---|---|---|---|---|"]
for t in threads:
    for c in configs:
        o = [json.load(open("%s/%s-t%s-p%d-ours.json" % (raw, c, t, p))) for p in range(1, pairs + 1)]
        q = [json.load(open("%s/%s-t%s-p%d-torch.json" % (raw, c, t, p))) for p in range(1, pairs + 1)]
        ratio = [a["tokens_per_s_median"] / b["tokens_per_s_median"] for a, b in zip(o, q)]
        rows.append("| %s | %s | %s | %s | **%s** | %s | %s | %s / %s | %s |" % (
            c, t,
            mmm([a["tokens_per_s_median"] for a in o], "%.0f"),
            mmm([b["tokens_per_s_median"] for b in q], "%.0f"),
            mmm(ratio, "%.2f"),
            mmm([a["mfu_median"] for a in o], "%.2f"),
            mmm([b["mfu_median"] for b in q], "%.2f"),
            mmm([a["sgemm_2048_gflops"] for a in o], "%.0f"),
            mmm([b["sgemm_2048_gflops"] for b in q], "%.0f"),
            "%.0f = %.0f" % (o[0]["model_flops_per_token"], q[0]["model_flops_per_token"])))
print("\n".join(rows))
print()
print("Per-run values are each run's median over its timed steps; the table gives the median (min-max) over the %d pairs. " % pairs +
      "Ratio = ours / torch tokens/s of the two runs of one A B pair. MFU = model FLOPs/token (MODEL.md) x tokens/s / that process's own SGEMM 2048^3 peak.")
# Our op-class breakdown, from the last pair of each config/threads.
print()
print("Furnace forward+backward breakdown (last pair; replayed kernels, see bench/REPORT.md):")
print()
print("| config | threads | class | s/step | share of fwd+bwd | GFLOP/s | of SGEMM peak |")
print("|---|---|---|---|---|---|---|")
for t in threads:
    for c in configs:
        a = json.load(open("%s/%s-t%s-p%d-ours.json" % (raw, c, t, pairs)))
        for b in a.get("breakdown", []):
            print("| %s | %s | %s | %.4f | %.0f%% | %s | %s |" % (c, t, b["class"].split(" (")[0], b["seconds_per_step"],
                  100 * b["share_of_fwd_bwd"], "%.1f" % b["gflops"] if "gflops" in b else "",
                  "%.0f%%" % (100 * b["fraction_of_sgemm_peak"]) if "fraction_of_sgemm_peak" in b else ""))
        print("| %s | %s | (optimizer, outside fwd+bwd) | %.4f | | | |" % (c, t, a["optimizer_s"]["median"]))
EOF
)"

{
  echo "# Furnace vs PyTorch eager: training throughput ($DATE)"
  echo
  bench_report_provenance ""
  echo "- torch: $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  echo "- settings: OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=<threads>, GOMP_SPINCOUNT=1000, both sides; $WARMUP warm-up + $STEPS timed steps per run; $PAIRS A B pairs (ours first)"
  echo "- command: \`bench/run_train_vs_pytorch.sh --pairs $PAIRS --threads \"$THREADS\" --configs \"$CONFIGS\" --steps $STEPS --warmup $WARMUP$BIN_FLAG\`"
  echo "- raw JSON: bench/results/raw/$STAMP/"
} > "$OUTMD"
bench_finish_report "$TABLE" "Exact per-run commands:"
