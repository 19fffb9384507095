#!/usr/bin/env bash
# The analytical byte model (layout_bytes.h) against the communicators' counters on every layout
# of tests/runtime/parallel/layout_equivalence_test.cc, with the demo model's dims, every layer
# MoE (--moe_every 1) and every second layer MoE (--moe_every 2, so the dense MLP's tensor-parallel
# all-reduces are in the count too). Short runs (1 warm-up + 2 steps, B=2): this checks bytes, not
# speed. Exits 3 on the first mismatch, after printing bench_distributed's report of it.
#
# Usage: bench/distributed/run_bytes_check.sh [--bin DIR]
# --bin defaults to the first of build/bin, build-bench/bin, build-bench/bench that holds
# bench_distributed.
# Writes bench/results/<date>-distributed-bytes-check.md (commit, exact commands, one row per run).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=../lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"  # sets ROOT
BIN=""
bench_parse_flags "bin=BIN" "$@"
BIN_FLAG=""  # the report's command line repeats --bin when one was given
[[ -n "$BIN" ]] && BIN_FLAG=" --bin $BIN"
[[ -n "$BIN" ]] || BIN="$(bench_default_bin bench_distributed)"
EXE="$BIN/bench_distributed"
bench_require_exe "$EXE" "build it: cmake --build build --target bench_distributed"
DATE="$(date +%F)"
OUTMD="$ROOT/bench/results/$DATE-distributed-bytes-check.md"
[[ -e "$OUTMD" ]] && OUTMD="$ROOT/bench/results/$DATE-$(date +%H%M%S)-distributed-bytes-check.md"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)"
TMP="$(mktemp -d /tmp/bytes_check.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

LAYOUTS=(
  "--dp 2" "--tp 2" "--pp 2" "--pp 4 --micro_batches 8" "--dp 2 --ep 2" "--dp 4 --ep 4"
  "--dp 4 --ep 2 --esp 2" "--tp 2 --ep 2" "--pp 2 --dp 2 --tp 2" "--pp 2 --dp 2 --tp 2 --ep 2 --esp 2"
  "--dp 2 --esp 2" "--tp 2 --esp 2" "--dp 8 --ep 8"
)
ROWS="| layout | moe_every | world | collectives with traffic: measured = analytical bytes (summed over ranks and 3 steps) | checks | match |
|---|---|---|---|---|---|"
CMDS=""
for layout in "${LAYOUTS[@]}"; do
  for every in 1 2; do
    # shellcheck disable=SC2206
    args=($layout --moe_every "$every" --micro_batch 2 --steps 2 --warmup 1)
    CMDS+="OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 ${EXE#"$ROOT"/} ${args[*]}"$'\n'
    rc=0
    env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 \
      "$EXE" "${args[@]}" --json "$TMP/r.json" > "$TMP/r.txt" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
      cat "$TMP/r.txt" >&2
      echo "*** $layout --moe_every $every: exit $rc ***" >&2
      exit "$rc"
    fi
    ROWS+=$'\n'"$(/usr/bin/python3 - "$TMP/r.json" "$layout" "$every" <<'EOF'
import json, sys
j, layout, every = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
ops = ["%s %d" % (k, v["measured"]) for k, v in j["bytes_check"].items() if v["measured"] or v["analytical"]]
checks = sum(v["checks"] for v in j["bytes_check"].values()) + j.get("row_checks", 0)
print("| `%s` | %s | %d | %s | %d | %s |" % (layout, every, j["layout"]["world"], ", ".join(ops), checks,
      "yes" if j["match"] else "**NO**"))
EOF
)"
    echo "$layout --moe_every $every: ok" >&2
  done
done
{
  echo "# Analytical vs measured bytes per collective ($DATE)"
  echo
  echo "- commit: \`$COMMIT\` ($DIRTY uncommitted paths in the tree at run time)"
  echo "- model: demo dims (V=64 T=64 d=64 h=4 L=4 E=8 k=2 f=128), B=2, m=2 (8 for pp=4), dropless; 1 warm-up + 2 steps, each step checked"
  echo "- settings: OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000 for every rank (a byte check: times not used)"
  echo "- command: \`bench/distributed/run_bytes_check.sh$BIN_FLAG\`"
  echo
  echo "$ROWS"
  echo
  echo "Checks per run: per rank for routing-independent collectives; per (stage, ep coordinate) group"
  echo "for the routed ones (ep > 1), plus the per-rank whole-row / cross-collective consistency checks."
  echo
  echo "Exact per-run commands:"
  echo
  echo '```'
  printf '%s' "$CMDS"
  echo '```'
} > "$OUTMD"
echo "$ROWS"
echo "written: $OUTMD"
