#!/usr/bin/env bash
# The one prepared script for a machine with a GPU (issue 13, item 6): on a fresh Debian 12 host
# with the NVIDIA driver and CUDA under /usr/local/cuda it installs what the build needs
# (scripts/setup.sh --no-web), builds with CUDA for sm_90 only what the GPU checks need (the
# gpu_tests and gpu_benches targets), runs every ctest labelled gpu and every registered GPU
# benchmark (bench/CMakeLists.txt: furnace_gpu_bench), all within a time budget (8 minutes by
# default), and writes one markdown report. Where there is no GPU it says "no GPU: the gpu tests
# skip", runs them anyway (each case skips itself, saying why) and still writes the report.
#
# Usage: tests/gpu/run.sh [REPORT] [--no-build] [--build-dir DIR] [--budget-s SECONDS]
#   REPORT       the report file (default: $OUT/gpu-report.md, or ./gpu-report.md without $OUT)
#   --no-build   skip setup and build; use the build directory as it is
#   --build-dir  the CMake build directory (default: build)
#   --budget-s   the whole run's wall-clock budget (default 480); each step gets what is left
# Exit status: 0 when every step that ran passed (skipped tests are not failures), 1 otherwise,
# 2 for bad arguments. The report is written in every case.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
report="" build_dir="build" budget=480 do_build=1
while (($#)); do
  case "$1" in
    --no-build) do_build=0 ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "run.sh: --build-dir needs a directory" >&2; exit 2; }
      build_dir="$2"; shift ;;
    --budget-s)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || {
        echo "run.sh: --budget-s needs a whole number of seconds" >&2; exit 2; }
      budget="$2"; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "run.sh: unknown flag '$1' (allowed: --no-build, --build-dir DIR, --budget-s N)" >&2
        exit 2 ;;
    *)
      [ -z "$report" ] || { echo "run.sh: one report path only, got '$report' and '$1'" >&2; exit 2; }
      report="$1" ;;
  esac
  shift
done
if [ -z "$report" ]; then
  if [ -n "${OUT:-}" ]; then report="$OUT/gpu-report.md"; else report="$PWD/gpu-report.md"; fi
fi
mkdir -p "$(dirname "$report")"
report="$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"
cd "$repo"
case "$build_dir" in /*) ;; *) build_dir="$repo/$build_dir" ;; esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

status=0
log() { echo "[gpu-run $(date -u +%H:%M:%S)] $*" >&2; }
# Seconds left of the budget, at least 1 (`timeout 0` would mean no limit at all).
left() { local l=$((budget - SECONDS)); ((l > 0)) && echo "$l" || echo 1; }
# What is left, but at most $1 seconds: one benchmark that hangs must not take the others' time.
capped() { local l; l="$(left)"; ((l < $1)) && echo "$l" || echo "$1"; }
section() { printf '\n## %s\n\n' "$1" >>"$work/body.md"; }
fence() { { echo '```'; tail -c "${2:-4000}" "$1"; echo '```'; } >>"$work/body.md"; }

# --- The machine.
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$work/gpus.txt" 2>&1 &&
   grep -q '^GPU ' "$work/gpus.txt"; then
  gpu=1
  log "GPU: $(head -1 "$work/gpus.txt")"
else
  log "no GPU: the gpu tests skip"
fi
section "Machine"
{
  if commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)"; then
    git -C "$repo" diff --quiet HEAD 2>/dev/null || commit+=" (with uncommitted changes)"
  else
    commit="unknown (not a git checkout)"
  fi
  echo "- commit: $commit"
  echo "- host: $(uname -srm), $(nproc) CPUs"
  if ((gpu)); then
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  else
    echo "- **no GPU: the gpu tests skip** (each gpu-labelled case skips itself and says why)"
  fi
  if command -v nvcc >/dev/null 2>&1; then
    echo "- CUDA: $(nvcc --version | grep -o 'release [0-9.]*' | head -1)"
  else
    echo "- CUDA: no nvcc found (a CPU-only build: the CUDA tests are not built)"
  fi
} >>"$work/body.md"

# --- Setup and build.
section "Build"
if ((do_build)); then
  log "setup (scripts/setup.sh --no-web)"
  if timeout "$(left)" scripts/setup.sh --no-web >"$work/setup.log" 2>&1; then
    echo "- setup: scripts/setup.sh --no-web: ok" >>"$work/body.md"
  else
    echo "- setup: scripts/setup.sh --no-web **failed** (the build below may still work):" \
      >>"$work/body.md"
    fence "$work/setup.log" 2000
  fi
  cuda_flag=-DFURNACE_ENABLE_CUDA=OFF
  command -v nvcc >/dev/null 2>&1 && cuda_flag=-DFURNACE_ENABLE_CUDA=ON
  log "configure ($cuda_flag) and build gpu_tests gpu_benches in $build_dir"
  build_start=$SECONDS
  if timeout "$(left)" cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "$cuda_flag" >"$work/build.log" 2>&1 &&
     timeout "$(left)" cmake --build "$build_dir" -j "$(nproc)" --target gpu_tests gpu_benches \
       >>"$work/build.log" 2>&1; then
    echo "- build: \`cmake --build $build_dir --target gpu_tests gpu_benches\` ($cuda_flag):" \
      "ok in $((SECONDS - build_start)) s" >>"$work/body.md"
  else
    status=1
    echo "- build: **failed** after $((SECONDS - build_start)) s:" >>"$work/body.md"
    fence "$work/build.log" 6000
  fi
else
  echo "- build: skipped (--no-build), using $build_dir as it is" >>"$work/body.md"
fi
grep -q 'FURNACE_ENABLE_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null &&
  echo "- build directory: CUDA components ON" >>"$work/body.md" ||
  echo "- build directory: CUDA components OFF (the CUDA kernel and NCCL tests are not in it)" \
    >>"$work/body.md"

# --- The gpu-labelled tests.
section "gpu-labelled tests"
if [ ! -f "$build_dir/CTestTestfile.cmake" ]; then
  status=1
  echo "**not run**: $build_dir is not a configured build directory" >>"$work/body.md"
elif ((budget - SECONDS < 10)); then
  status=1
  echo "**not run**: the time budget ($budget s) was spent before the tests" >>"$work/body.md"
else
  log "ctest -L gpu ($(left) s left)"
  tests_start=$SECONDS
  # One BLAS thread per test process: ctest runs one process per core, and the CPU oracles of the
  # gpu tests would otherwise start a thread per core each.
  OPENBLAS_NUM_THREADS=1 timeout "$(left)" ctest --test-dir "$build_dir" -L gpu --timeout 300 \
    -j "$(nproc)" \
    --output-on-failure --output-junit "$work/gpu-junit.xml" >"$work/ctest.log" 2>&1
  rc=$?
  echo "\`ctest -L gpu\` exit status $rc in $((SECONDS - tests_start)) s." >>"$work/body.md"
  if [ -f "$work/gpu-junit.xml" ]; then
    python3 - "$work/gpu-junit.xml" >>"$work/body.md" <<'EOF' || status=1
import sys
import xml.etree.ElementTree as ET

cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
for c in cases:
    if c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail":
        result = "failed"
    elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
        result = "skipped"
    else:
        result = "passed"
    counts[result] += 1
    # gtest prints "<file>:<line>: Skipped" and then the reason GTEST_SKIP gave.
    why = ""
    lines = (c.findtext("system-out") or "").splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines):
            why = lines[i + 1].strip()[:120].replace("|", "/")
            break
    rows.append((c.get("name"), result, c.get("time", ""), why if result == "skipped" else ""))
print(f"\n{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
      f"of {len(rows)}.\n")
if rows:
    print("| test | result | seconds | note |\n|---|---|---|---|")
    for name, result, secs, why in rows:
        print(f"| {name} | {'**failed**' if result == 'failed' else result} | {secs} | {why} |")
sys.exit(1 if counts["failed"] else 0)
EOF
  fi
  if ((rc != 0)); then
    status=1
    echo -e "\nFailures (the tail of ctest's output):\n" >>"$work/body.md"
    fence "$work/ctest.log" 8000
  fi
  if grep -q 'NOT_BUILT' "$work/ctest.log"; then
    status=1
    echo "Some gpu-labelled executables are not built (\`*_NOT_BUILT\` above): register them" \
      "with furnace_gpu_test() in tests/CMakeLists.txt's subdirectories." >>"$work/body.md"
  fi
fi

# --- The GPU benchmarks: the executables bench/ registered with furnace_gpu_bench(), listed by
# the build in gpu_benches.txt, each run with no arguments (bench/gpu/REPORT.md: each takes well
# under a minute on an H200), at most 180 s each; its stdout is its result.
section "GPU benchmarks"
benches=()
if [ -f "$build_dir/gpu_benches.txt" ]; then
  while IFS= read -r b; do [ -n "$b" ] && benches+=("$b"); done <"$build_dir/gpu_benches.txt"
fi
if ((${#benches[@]} == 0)); then
  echo "None registered: bench/ has no GPU benchmark yet (furnace_gpu_bench in" \
    "bench/CMakeLists.txt lists them)." >>"$work/body.md"
else
  # Without a GPU each still runs: it must print its table's header, say "no GPU" and exit 0.
  ((gpu)) || echo "No GPU: each benchmark below only says so (and must exit 0)." >>"$work/body.md"
  for b in "${benches[@]}"; do
    name="${b##*/}"
    if ((budget - SECONDS < 5)); then
      status=1
      echo "### $name: **not run**, the time budget is spent" >>"$work/body.md"
      continue
    fi
    log "benchmark $name ($(left) s left)"
    bench_start=$SECONDS
    timeout "$(capped 180)" "$b" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
    ((rc == 124)) && echo "(killed by the time limit)" >>"$work/$name.err"
    printf '\n### %s (exit status %d, %d s)\n\n' "$name" "$rc" "$((SECONDS - bench_start))" \
      >>"$work/body.md"
    fence "$work/$name.out" 8000
    if ((rc != 0)); then
      status=1
      fence "$work/$name.err" 3000
    fi
  done
fi

# --- The report.
{
  echo "# GPU run: $( ((status == 0)) && echo passed || echo FAILED )$( ((gpu)) || echo ' (no GPU: the gpu tests skip)')"
  echo
  echo "Written by \`tests/gpu/run.sh\` on $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $SECONDS s of a" \
    "$budget s budget."
  cat "$work/body.md"
} >"$report"
log "report: $report ($( ((status == 0)) && echo passed || echo FAILED))"
exit "$status"
