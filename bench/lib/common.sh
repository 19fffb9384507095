# shellcheck shell=bash disable=SC2034  # sets globals for the sourcing script
# The part every A-B benchmark driver repeats (bench/run_train_vs_pytorch.sh,
# bench/distributed/run_scaling.sh, bench/distributed/run_moe_layer_vs_torch.sh; the flag and binary
# helpers also bench/distributed/run_bytes_check.sh): flag parsing with --help from the script's
# header comment, where the binaries are, whether torch imports, the thread environment pinned
# before each process starts (BENCHMARKING.md), and the provenance a report records (commit,
# uncommitted paths, load average, host, exact commands). Sourced, never run; sets ROOT (the
# repository root) on sourcing.
# Functions that meet a bad argument, a missing binary or a missing torch exit the calling script
# (2, 1 and 1), as the drivers did inline before.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# bench_parse_flags "name=VAR ..." "$@": --name VALUE sets VAR; -h/--help prints the calling
# script's header comment (line 2 down to `set -euo`) and exits 0; anything else exits 2.
bench_parse_flags() {
  local spec="$1" pair var
  shift
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 0 ;;
    esac
    var=""
    for pair in $spec; do
      [[ "$1" == "--${pair%%=*}" ]] && var="${pair#*=}"
    done
    [[ -n "$var" ]] || { echo "unknown argument $1" >&2; exit 2; }
    printf -v "$var" '%s' "$2"
    shift 2
  done
}

# bench_require_exe <path> <how to build it>: exits 1 unless <path> is executable.
bench_require_exe() {
  [[ -x "$1" ]] || { echo "missing $1 ($2)" >&2; exit 1; }
}

# bench_default_bin <program>: prints the directory a driver takes its binaries from when no --bin
# is given: the first of build/bin (the in-tree build: scripts/build.sh builds into build/, and
# CMakeLists.txt puts every program in <build>/bin), build-bench/bin, build-bench/bench that holds
# an executable <program>; build/bin when none does, so bench_require_exe names the in-tree path.
bench_default_bin() {
  local d
  for d in "$ROOT/build/bin" "$ROOT/build-bench/bin" "$ROOT/build-bench/bench"; do
    [[ -x "$d/$1" ]] && { echo "$d"; return; }
  done
  echo "$ROOT/build/bin"
}

# bench_require_torch [python]: exits 1 unless python (default /usr/bin/python3, the one the
# drivers run their PyTorch peers with) imports torch. Called before the first run, so a driver
# without torch stops at once instead of half-way through under `set -e`.
bench_require_torch() {
  local py="${1:-/usr/bin/python3}"
  "$py" -c 'import torch' 2>/dev/null || {
    echo "$py cannot import torch, which the PyTorch peer needs: install Debian's python3-torch" \
      "(sudo apt-get install -y python3-torch)" >&2
    exit 1
  }
}

# bench_thread_env <threads>: the pinned environment, as the command log writes it.
bench_thread_env() {
  echo "OPENBLAS_NUM_THREADS=$1 OMP_NUM_THREADS=$1 GOMP_SPINCOUNT=1000"
}

# bench_pinned <threads> <cmd...>: runs cmd with that environment set before it starts.
bench_pinned() {
  local t="$1"
  shift
  env OPENBLAS_NUM_THREADS="$t" OMP_NUM_THREADS="$t" GOMP_SPINCOUNT=1000 "$@"
}

# bench_begin_results <raw suffix> <report name> [full]: sets DATE, STAMP,
# RAW=bench/results/raw/<STAMP><raw suffix> (created), OUTMD=bench/results/<DATE>-<report name>.md
# (with the time of day added rather than overwrite one), COMMIT (short hash; the full one with
# `full`), DIRTY (uncommitted paths), LOAD_START, CMDLOG (RAW/commands.txt, emptied) and T0.
bench_begin_results() {
  local raw_suffix="$1" report="$2" rev_args=(--short)
  [[ "${3:-}" == full ]] && rev_args=()
  DATE="$(date +%F)"
  STAMP="$(date +%Y%m%d-%H%M%S)"
  RAW="$ROOT/bench/results/raw/$STAMP$raw_suffix"
  OUTMD="$ROOT/bench/results/$DATE-$report.md"
  [[ -e "$OUTMD" ]] && OUTMD="$ROOT/bench/results/$DATE-$(date +%H%M%S)-$report.md"
  mkdir -p "$RAW"
  COMMIT="$(git -C "$ROOT" rev-parse "${rev_args[@]}" HEAD 2>/dev/null || echo unknown)"
  DIRTY="$(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)"
  LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
  CMDLOG="$RAW/commands.txt"
  : > "$CMDLOG"
  T0=$SECONDS
}

# bench_end_runs: sets LOAD_END and ELAPSED (seconds since bench_begin_results).
bench_end_runs() {
  LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"
  ELAPSED=$((SECONDS - T0))
}

# bench_report_provenance [host note]: the report's commit, host and load-average lines.
bench_report_provenance() {
  echo "- commit: \`$COMMIT\` ($DIRTY uncommitted paths in the tree at run time)"
  echo "- host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')${1:-}"
  echo "- load average (1/5/15 min): start $LOAD_START, end $LOAD_END (shared machine: others were compiling)"
}

# bench_finish_report <table> <commands heading> [note]: appends the table and then CMDLOG, under
# the heading as a code block, to OUTMD (which the caller began with its title and settings lines);
# then prints the table and "written: OUTMD<note>".
bench_finish_report() {
  {
    echo
    echo "$1"
    echo
    echo "$2"
    echo
    echo '```'
    cat "$CMDLOG"
    echo '```'
  } >> "$OUTMD"
  echo
  echo "$1"
  echo
  echo "written: $OUTMD${3:-}"
}
