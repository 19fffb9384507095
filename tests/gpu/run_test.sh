#!/usr/bin/env bash
# ctest gpu_run_script: tests/gpu/run.sh passes `bash -n`, refuses a bad flag, and runs end to end
# with --no-build against the build directory given as $1 (the gpu-labelled tests there pass or
# skip); the report it writes names the machine, the tests and the benchmarks, and on a host
# without a GPU says "no GPU: the gpu tests skip".
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
grep -Eq '^[0-9]+ passed, 0 failed, [0-9]+ skipped of [1-9][0-9]*\.' "$tmp/report.md" ||
  fail "the report has no test summary with at least one gpu test"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
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
echo "run_test.sh: ok"
