#!/usr/bin/env bash
# ctest gpu_run_script: tests/gpu/run.sh passes `bash -n`, refuses a bad flag, and runs end to end
# with --no-build against the build directory given as $1 (the gpu-labelled tests there pass or
# skip); the report it writes names the machine, the tests and the benchmarks, and on a host
# without a GPU says "no GPU: the gpu tests skip". Where the build has CUDA, the same through a
# bundle (tests/gpu/bundle.sh packs the build's gpu executables and libraries; run.sh --bundle runs
# them without the build directory), as on the GPU machines that have no package registry.
set -euo pipefail
build="${1:?usage: run_test.sh BUILD_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
fail() {
  echo "run_test.sh: $*" >&2
  [ -f "$tmp/report.md" ] && cat "$tmp/report.md" >&2
  exit 1
}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

bash -n "$here/run.sh"
rc=0
bash "$here/run.sh" --bogus >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "an unknown flag should exit 2, got $rc"

rc=0
bash "$here/run.sh" "$tmp/report.md" --no-build --build-dir "$build" --budget-s 240 \
  2>"$tmp/stderr" || rc=$?
[ -s "$tmp/report.md" ] || fail "no report written (exit $rc): $(cat "$tmp/stderr")"
[ "$rc" -eq 0 ] || fail "run.sh exited $rc"
for heading in '# GPU run: passed' '## Machine' '## Build' '## gpu-labelled tests' \
  '## GPU benchmarks'; do
  grep -q "^$heading" "$tmp/report.md" || fail "the report lacks '$heading'"
done
grep -q 'build: skipped (--no-build)' "$tmp/report.md" || fail "the report should say --no-build"
# Listed to a file first: grep -q leaving early would fail the pipe (pipefail) with SIGPIPE.
tar -tzf "$tmp/gpu-logs.tar.gz" >"$tmp/logs.txt" 2>/dev/null || true
grep -q 'ctest.log' "$tmp/logs.txt" || fail "no gpu-logs.tar.gz with the steps' output beside the report"
# The benchmarks run before the tests (the measurements first; a hanging test costs only tests).
[ "$(grep -n '^## GPU benchmarks' "$tmp/report.md" | cut -d: -f1)" -lt \
  "$(grep -n '^## gpu-labelled tests' "$tmp/report.md" | cut -d: -f1)" ] ||
  fail "the benchmarks should come before the tests"
grep -Eq '^[0-9]+ passed, 0 failed, [0-9]+ skipped of [1-9][0-9]*\.' "$tmp/report.md" ||
  fail "the report has no test summary with at least one gpu test"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
  grep -q 'no GPU: the gpu tests skip' "$tmp/report.md" || fail "the report should say no GPU"
  grep -q 'no GPU: the gpu tests skip' "$tmp/stderr" || fail "run.sh should say no GPU"
  # Every registered GPU benchmark ran, exited 0 and said why it measured nothing.
  if [ -s "$build/gpu_benches.txt" ]; then
    while IFS= read -r b; do
      [ -n "$b" ] || continue
      grep -q "^### ${b##*/} (exit status 0" "$tmp/report.md" ||
        fail "benchmark ${b##*/} did not run or did not exit 0 without a GPU"
    done <"$build/gpu_benches.txt"
    grep -q 'no GPU: .*nothing measured' "$tmp/report.md" ||
      fail "the benchmarks should say they measured nothing"
  fi
fi

# The bundle: packed from this build, unpacked and run by run.sh with no build directory at all.
if grep -q 'FURNACE_ENABLE_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  bash "$here/bundle.sh" --build-dir "$build" --no-build -o "$tmp/bundle.tar.xz" 2>"$tmp/bundle.log" ||
    fail "bundle.sh failed: $(cat "$tmp/bundle.log")"
  rc=0
  bash "$here/run.sh" "$tmp/bundle-report.md" --bundle "$tmp/bundle.tar.xz" --build-dir /nonexistent \
    --budget-s 240 2>"$tmp/stderr" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/bundle-report.md" >&2; fail "run.sh --bundle exited $rc"; }
  grep -q 'every library the executables load is found' "$tmp/bundle-report.md" ||
    fail "run.sh --bundle did not resolve the executables' libraries"
  grep -Eq '^[0-9]+ passed, 0 failed, [0-9]+ skipped of [1-9][0-9]*\.' "$tmp/bundle-report.md" ||
    fail "the bundle's report has no test summary"
  while IFS= read -r b; do
    [ -n "$b" ] || continue
    grep -q "^### ${b##*/} (exit status 0" "$tmp/bundle-report.md" ||
      fail "the bundle's benchmark ${b##*/} did not run or did not exit 0"
  done <"$build/gpu_benches.txt"
fi
echo "run_test.sh: ok"
