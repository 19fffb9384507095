#!/usr/bin/env bash
# The one prepared script for a machine with a GPU (issue 13, item 6): on a fresh Debian 12 host
# with the NVIDIA driver and CUDA under /usr/local/cuda it installs what the build needs
# (scripts/setup.sh --no-web), builds with CUDA for sm_90 only what the GPU checks need (the
# gpu_tests and gpu_benches targets), runs every ctest labelled gpu and every registered GPU
# benchmark (bench/CMakeLists.txt: furnace_gpu_bench), all within a time budget (8 minutes by
# default), and writes one markdown report. Where there is no GPU it says "no GPU: the gpu tests
# skip", runs them anyway (each case skips itself, saying why) and still writes the report.
# On a GPU machine without the build's packages and without a package registry (the ones this
# workplace lends), give it the archive tests/gpu/bundle.sh made on a development machine instead:
# it builds nothing, runs the same tests (each executable, its gtest XML read back) and benchmarks
# from the archive, with the archive's libraries and the machine's CUDA libraries.
#
# Usage: tests/gpu/run.sh [REPORT] [--no-build] [--build-dir DIR] [--bundle ARCHIVE] [--budget-s N]
#   REPORT       the report file (default: $OUT/gpu-report.md, or ./gpu-report.md without $OUT)
#   --no-build   skip setup and build; use the build directory as it is
#   --build-dir  the CMake build directory (default: build)
#   --bundle     run what tests/gpu/bundle.sh packed (no setup, no build, no build directory)
#   --budget-s   the whole run's wall-clock budget (default 480); each step gets what is left
# Order: the machine, the build (or the bundle), the benchmarks (the training step first: its MFU is
# what no other machine can measure), then the tests (NCCL's last: a hang there costs least). The
# report is rewritten after every step, so a run cut short by the caller's own limit still leaves
# everything measured so far; beside it, gpu-logs.tar.gz (rewritten with it) holds every step's
# full output.
# Exit status: 0 when every step that ran passed (skipped tests are not failures; on a machine
# with a GPU, a test or benchmark that says "no GPU" is one), 1 otherwise, 2 for bad arguments.
# The report is written in every case.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
report="" build_dir="build" budget=480 do_build=1 bundle=""
while (($#)); do
  case "$1" in
    --no-build) do_build=0 ;;
    --build-dir)
      [ $# -ge 2 ] || { echo "run.sh: --build-dir needs a directory" >&2; exit 2; }
      build_dir="$2"; shift ;;
    --bundle)
      [ $# -ge 2 ] || { echo "run.sh: --bundle needs the archive tests/gpu/bundle.sh wrote" >&2; exit 2; }
      bundle="$2"; do_build=0; shift ;;
    --budget-s)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || {
        echo "run.sh: --budget-s needs a whole number of seconds" >&2; exit 2; }
      budget="$2"; shift ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "run.sh: unknown flag '$1' (allowed: --no-build, --build-dir DIR, --bundle ARCHIVE, --budget-s N)" >&2
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
if [ -n "$bundle" ]; then
  [ -f "$bundle" ] || { echo "run.sh: --bundle $bundle: no such file" >&2; exit 2; }
  bundle="$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")"
fi
cd "$repo" || exit 2
case "$build_dir" in /*) ;; *) build_dir="$repo/$build_dir" ;; esac
work="$(mktemp -d)"
logs="$(dirname "$report")/gpu-logs.tar.gz"
# Every step's output (logs, gtest XML), kept beside the report when the script ends.
keep_logs() {
  tar -C "$work" -czf "$logs.tmp" --exclude=./bundle --exclude=./body.md . 2>/dev/null &&
    mv "$logs.tmp" "$logs" || rm -f "$logs.tmp"
}
trap 'keep_logs; rm -rf "$work"' EXIT
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

status=0
finished=0
# The report as it stands: the header says whether the run reached its end.
write_report() {
  local verdict
  if ((finished)); then
    verdict="$( ((status == 0)) && echo passed || echo FAILED)"
  else
    verdict="INCOMPLETE (written at $SECONDS s; a run cut short ends here$( ((status == 0)) || echo ', with failures already'))"
  fi
  {
    echo "# GPU run: ${verdict}$( ((gpu)) || echo ' (no GPU: the gpu tests skip)')"
    echo
    echo "Written by \`tests/gpu/run.sh\` on $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $SECONDS s of a" \
      "$budget s budget."
    # The benchmarks' GOAL lines (issue 13's figures), first: what the note needs.
    if [ -s "$work/goals.md" ]; then
      printf '\n## Goals\n\n'
      cat "$work/goals.md"
    fi
    cat "$work/body.md"
    # What the step under way has done so far (the tests' executables, one line each).
    if [ -f "$work/pending.md" ]; then cat "$work/pending.md"; fi
  } >"$report.tmp"
  mv "$report.tmp" "$report"
  keep_logs  # with the report, so a run killed outright still leaves both
}
# `timeout` that also kills a step ignoring SIGTERM 10 s later.
limit() { timeout -k 10 "$@"; }
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
  echo "- host: $(uname -srm), $(nproc) CPUs, $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown OS}"), $(ldd --version 2>/dev/null | head -1)"
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
write_report

# --- Setup and build (or the bundle: unpacked, and every library its executables load resolved).
section "Build"
bundle_dir=""
if [ -n "$bundle" ]; then
  bundle_dir="$work/bundle"
  mkdir -p "$bundle_dir"
  # xz, or Python's lzma where the machine has no xz.
  unpack() {
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$bundle" | tar -C "$bundle_dir" -xf -
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle" "$bundle_dir"
    fi
  }
  if ! unpack 2>"$work/unpack.log"; then
    status=1
    echo "- bundle: **could not unpack** $bundle:" >>"$work/body.md"
    fence "$work/unpack.log" 2000
  else
    echo "- bundle: $bundle ($(du -h "$bundle" | cut -f1)); $(tr '\n' ';' <"$bundle_dir/BUILD")" \
      >>"$work/body.md"
    # The CUDA libraries the bundle leaves to the machine: its toolkit's, or its Python's
    # nvidia-* packages (cuBLAS, NCCL), wherever they are.
    cuda_libs=()
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
      [ -d "$d" ] && cuda_libs+=("$d")
    done
    if command -v python3 >/dev/null 2>&1; then
      while IFS= read -r d; do [ -n "$d" ] && cuda_libs+=("$d"); done < <(python3 -c '
import glob, os, site
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
seen = set()
for r in roots:
    for lib in glob.glob(os.path.join(r, "nvidia", "**", "lib", "lib*.so*"), recursive=True):
        d = os.path.dirname(lib)
        if d not in seen:
            seen.add(d)
            print(d)
' 2>/dev/null)
    fi
    LD_LIBRARY_PATH="$bundle_dir/lib${cuda_libs[*]:+$(printf ':%s' "${cuda_libs[@]}")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    # The bundle's C++ runtime needs the glibc it was built against (Debian 12: 2.36). Where this
    # one is older, the machine's own libstdc++ and libgcc_s serve: the executables need only
    # glibc 2.34, so this helps machines with 2.34 or 2.35 (Ubuntu 22.04); older ones cannot run
    # the bundle at all (ldd says so below).
    for rt in libstdc++.so.6 libgcc_s.so.1; do
      # Captured, not piped into grep -q (pipefail: ldd killed by SIGPIPE would read as no match).
      [ -e "$bundle_dir/lib/$rt" ] || continue
      needs="$(ldd "$bundle_dir/lib/$rt" 2>&1 || true)"
      if [[ "$needs" == *GLIBC_*"not found"* ]]; then
        mkdir -p "$bundle_dir/lib.unused"
        mv "$bundle_dir/lib/$rt" "$bundle_dir/lib.unused/"
        echo "- $rt: the machine's (the bundle's needs a newer glibc)" >>"$work/body.md"
      fi
    done
    echo "- libraries: the bundle's, then ${cuda_libs[*]:-(no CUDA library directory found)}" \
      >>"$work/body.md"
    unresolved="" lazy=""
    for exe in "$bundle_dir"/bin/*; do
      miss="$(ldd "$exe" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
      [ -n "$miss" ] && unresolved+="$(basename "$exe"): $miss; "
    done
    # cuBLAS and NCCL are opened on first use (not in ldd's list): found where the loader looks.
    if [ -f "$bundle_dir/lazy_libs.txt" ]; then
      while IFS= read -r soname; do
        [ -n "$soname" ] || continue
        found=""
        for d in "$bundle_dir/lib" "${cuda_libs[@]}"; do
          [ -e "$d/$soname" ] && { found="$d/$soname"; break; }
        done
        [ -n "$found" ] || found="$(ldconfig -p 2>/dev/null | awk -v n="$soname" '$1 == n {print $NF; exit}')"
        if [ -z "$found" ]; then
          unresolved+="(opened on first use) $soname; "
          continue
        fi
        # Its own dependencies too (libcublas needs libcublasLt beside it).
        miss="$(ldd "$found" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ')"
        [ -n "$miss" ] && unresolved+="$soname ($found): $miss; "
      done <"$bundle_dir/lazy_libs.txt"
      lazy="$(tr '\n' ' ' <"$bundle_dir/lazy_libs.txt")"
    fi
    if [ -n "$unresolved" ]; then
      status=1
      echo "- **libraries not found**: $unresolved" >>"$work/body.md"
    else
      echo "- every library the executables load is found${lazy:+ (${lazy}opened on first use)}" \
        >>"$work/body.md"
    fi
  fi
elif ((do_build)); then
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
  # setup.sh --no-web fetched no charting library: a build without the dashboard (the GPU checks
  # need none), unless this checkout already has it (a build directory used for everything).
  web_flag=()
  [ -f web/node_modules/uplot/dist/uPlot.iife.min.js ] || web_flag=(-DFURNACE_WEB=OFF)
  log "configure ($cuda_flag) and build gpu_tests gpu_benches in $build_dir"
  build_start=$SECONDS
  if timeout "$(left)" cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "$cuda_flag" "${web_flag[@]}" >"$work/build.log" 2>&1 &&
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
if [ -z "$bundle" ]; then
  grep -q 'FURNACE_ENABLE_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null &&
    echo "- build directory: CUDA components ON" >>"$work/body.md" ||
    echo "- build directory: CUDA components OFF (the CUDA kernel and NCCL tests are not in it)" \
      >>"$work/body.md"
fi

# --- The driver against the toolkit the executables were built with. The CUDA runtime is linked
# statically, so a driver older than its major version needs (CUDA 13: 580, 12: 525, 11: 450)
# fails every call with "no GPU": the run would spend its whole budget writing failures. Said
# once, and the run ends here.
if ((gpu)); then
  built_with=""
  if [ -n "$bundle_dir" ]; then
    built_with="$(grep -o 'release [0-9]*' "$bundle_dir/BUILD" 2>/dev/null | head -1)"
  elif command -v nvcc >/dev/null 2>&1; then
    built_with="$(nvcc --version | grep -o 'release [0-9]*' | head -1)"
  fi
  cuda_major="${built_with#release }"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  case "$cuda_major" in 13) need=580 ;; 12) need=525 ;; 11) need=450 ;; *) need="" ;; esac
  if [[ -n "$need" && "$driver" =~ ^([0-9]+)\. ]] && ((BASH_REMATCH[1] < need)); then
    status=1
    echo "- **driver $driver is older than CUDA $cuda_major needs ($need or newer)**: no CUDA call" \
      "can succeed, so nothing below ran. Run on a machine with a newer driver." >>"$work/body.md"
    log "driver $driver < $need (CUDA $cuda_major): stopping"
    finished=1
    write_report
    exit "$status"
  fi
  [ -n "$need" ] && echo "- driver $driver: new enough for CUDA $cuda_major ($need or newer)" \
    >>"$work/body.md"
fi

# --- The GPU benchmarks: the executables bench/ registered with furnace_gpu_bench(), listed by
# the build in gpu_benches.txt, each run with no arguments (bench/gpu/REPORT.md: each takes well
# under a minute on an H200), at most 150 s each, the training step's first; its stdout (line
# buffered, so a benchmark killed midway still shows its rows) is its result. The benchmarks leave
# the gpu-labelled tests after them 40% of the budget: the tests are what says the numbers are of
# kernels that compute the right thing. (The training step runs the model twice, attention
# probabilities stored then recomputed, each row with its GOAL line.)
section "GPU benchmarks"
tests_reserve=$((budget * 2 / 5))
benches=()
if [ -n "$bundle_dir" ]; then
  while IFS= read -r b; do [ -n "$b" ] && benches+=("$bundle_dir/bin/$b"); done \
    <"$bundle_dir/benches.txt"
elif [ -f "$build_dir/gpu_benches.txt" ]; then
  while IFS= read -r b; do [ -n "$b" ] && benches+=("$b"); done <"$build_dir/gpu_benches.txt"
fi
# The training step's MFU first, then the rest as registered.
ordered=()
for b in "${benches[@]}"; do [[ "${b##*/}" == *train_step* ]] && ordered+=("$b"); done
for b in "${benches[@]}"; do [[ "${b##*/}" == *train_step* ]] || ordered+=("$b"); done
benches=("${ordered[@]}")
line_buffered=()
command -v stdbuf >/dev/null 2>&1 && line_buffered=(stdbuf -oL)
if ((${#benches[@]} == 0)); then
  echo "None registered: bench/ has no GPU benchmark yet (furnace_gpu_bench in" \
    "bench/CMakeLists.txt lists them)." >>"$work/body.md"
else
  # Without a GPU each still runs: it must print its table's header, say "no GPU" and exit 0.
  ((gpu)) || echo "No GPU: each benchmark below only says so (and must exit 0)." >>"$work/body.md"
  for b in "${benches[@]}"; do
    name="${b##*/}"
    if ((budget - SECONDS - tests_reserve < 5)); then
      status=1
      echo "### $name: **not run**, the time budget is spent (what is left is the tests')" \
        >>"$work/body.md"
      continue
    fi
    log "benchmark $name ($(left) s left, $tests_reserve s of it kept for the tests)"
    bench_start=$SECONDS
    cap=$((budget - SECONDS - tests_reserve))
    ((cap > 150)) && cap=150
    limit "$(capped "$cap")" "${line_buffered[@]}" "$b" >"$work/$name.out" 2>"$work/$name.err" \
      </dev/null
    rc=$?
    ((rc == 124 || rc == 137)) && echo "(killed by the time limit)" >>"$work/$name.err"
    if ((gpu)) && grep -q '^no GPU:' "$work/$name.out"; then
      rc=1
      echo "(said \"no GPU\" on a machine with one: CUDA could not use it)" >>"$work/$name.err"
    fi
    grep '^GOAL ' "$work/$name.out" | sed 's/^GOAL /- /' >>"$work/goals.md"
    printf '\n### %s (exit status %d, %d s)\n\n' "$name" "$rc" "$((SECONDS - bench_start))" \
      >>"$work/body.md"
    fence "$work/$name.out" 8000
    if ((rc != 0)); then
      status=1
      fence "$work/$name.err" 3000
    fi
    write_report
  done
fi
write_report

# --- The gpu-labelled tests.
section "gpu-labelled tests"
if [ -n "$bundle_dir" ]; then
  # Each gpu test executable of the bundle, one after the other (one GPU), its gtest XML kept.
  mkdir -p "$work/xml"
  tests_start=$SECONDS
  : >"$work/ctest.log"
  rc=0
  # NCCL's last: a hang there (a collective that never completes) costs only what follows it. Its
  # abort cases (a watchdog abort, a peer that never joins: ncclCommAbort interrupting a collective
  # or an init, which some NCCL versions have hung in) run in an invocation of their own after the
  # rest, so a hang there cannot cost the other NCCL cases.
  abort_cases='*Aborts*:*NeverJoins*'
  runs=()
  while IFS= read -r name; do
    [[ -n "$name" && "$name" != *nccl* ]] && runs+=("$name|$name|")
  done <"$bundle_dir/tests.txt"
  while IFS= read -r name; do
    [[ -n "$name" && "$name" == *nccl* ]] && runs+=("$name|$name|-$abort_cases")
  done <"$bundle_dir/tests.txt"
  # Every NCCL executable's abort cases after all the other cases (gtest runs none where none
  # match).
  while IFS= read -r name; do
    [[ -n "$name" && "$name" == *nccl* ]] && runs+=("$name|$name.abort|$abort_cases")
  done <"$bundle_dir/tests.txt"
  for run in "${runs[@]}"; do
    IFS='|' read -r name tag filter <<<"$run"
    if ((budget - SECONDS < 10)); then
      rc=1
      echo "$tag: not run, the time budget is spent" >>"$work/ctest.log"
      continue
    fi
    filter_flag=()
    [ -n "$filter" ] && filter_flag=(--gtest_filter="$filter")
    log "test $tag ($(left) s left)"
    (cd "$work" && OPENBLAS_NUM_THREADS=1 limit "$(capped 150)" "$bundle_dir/bin/$name" \
      "${filter_flag[@]}" --gtest_output="xml:$work/xml/$tag.xml") >"$work/$tag.log" 2>&1 </dev/null
    one=$?
    if ((one != 0)); then
      rc=1
      { echo "== $tag: exit status $one"; tail -c 3000 "$work/$tag.log"; } >>"$work/ctest.log"
    fi
    [ -f "$work/pending.md" ] ||
      printf '\nTest executables run so far (the table comes when all have run):\n\n' >"$work/pending.md"
    printf -- '- %s: exit status %d\n' "$tag" "$one" >>"$work/pending.md"
    write_report
  done
  rm -f "$work/pending.md"
  echo "The bundle's gpu test executables, one after the other:" \
    "$( ((rc == 0)) && echo 'each exited 0' || echo 'some did not exit 0') in $((SECONDS - tests_start)) s." \
    >>"$work/body.md"
  gpu_flag=()
  ((gpu)) && gpu_flag=(--gpu)
  # Each executable's XML, or its output where it wrote none (killed or crashed: the cases its
  # log shows still count).
  reports=()
  for run in "${runs[@]}"; do
    IFS='|' read -r name tag filter <<<"$run"
    if [ -f "$work/xml/$tag.xml" ]; then
      reports+=("$work/xml/$tag.xml")
    elif [ -f "$work/$tag.log" ]; then
      reports+=("$work/$tag.log")
    fi
  done
  python3 "$repo/tests/gpu/gtest_report.py" "${gpu_flag[@]}" "${reports[@]}" >>"$work/body.md" ||
    status=1
  if ((rc != 0)); then
    status=1
    echo -e "\nFailures (the tail of each failing executable's output):\n" >>"$work/body.md"
    fence "$work/ctest.log" 8000
  fi
elif [ ! -f "$build_dir/CTestTestfile.cmake" ]; then
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
  OPENBLAS_NUM_THREADS=1 limit "$(left)" ctest --test-dir "$build_dir" -L gpu --timeout 150 \
    -j "$(nproc)" \
    --output-on-failure --output-junit "$work/gpu-junit.xml" >"$work/ctest.log" 2>&1
  rc=$?
  echo "\`ctest -L gpu\` exit status $rc in $((SECONDS - tests_start)) s." >>"$work/body.md"
  if [ -f "$work/gpu-junit.xml" ]; then
    GPU_PRESENT="$gpu" python3 - "$work/gpu-junit.xml" >>"$work/body.md" <<'EOF' || status=1
import os
import sys
import xml.etree.ElementTree as ET

gpu_present = os.environ.get("GPU_PRESENT") == "1"
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
for c in cases:
    if c.find("failure") is not None or c.find("error") is not None or c.get("status") == "fail":
        result = "failed"
    elif c.find("skipped") is not None or c.get("status") in ("notrun", "disabled"):
        result = "skipped"
    else:
        result = "passed"
    # gtest prints "<file>:<line>: Skipped" and then the reason GTEST_SKIP gave.
    why = ""
    lines = (c.findtext("system-out") or "").splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines):
            why = lines[i + 1].strip()[:120].replace("|", "/")
            break
    if result == "skipped" and gpu_present and why.startswith("no GPU"):
        result, why = "failed", "said no GPU on a machine with one: " + why
    counts[result] += 1
    rows.append((c.get("name"), result, c.get("time", ""), why if result != "passed" else ""))
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
write_report

# --- The report.
finished=1
write_report
log "report: $report ($( ((status == 0)) && echo passed || echo FAILED))"
exit "$status"
