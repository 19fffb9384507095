#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz for a bounded time:
#   tests/fuzz/run.sh TARGET [SECONDS] [LIBFUZZER_FLAG...]
# TARGET: job_spec | checkpoint_manifest | token_file | safetensors_writer; SECONDS default 20.
# Needs the clang build (tests/fuzz/build.sh); without it this exits 77, which ctest reports as
# skipped. New inputs that reach new code go to build-fuzz/corpus/TARGET (kept between runs, so a
# longer run continues from what earlier runs found); the committed seeds in
# tests/fuzz/TARGET/corpus are read, never written. A crash or a broken property exits non-zero,
# with the input saved under build-fuzz/artifacts/TARGET/: copy it into
# tests/fuzz/TARGET/regressions/, where the unit test fuzz_replay.TARGET.regressions replays it.
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
target="${1:?usage: tests/fuzz/run.sh TARGET [SECONDS] [LIBFUZZER_FLAG...]}"
seconds="${2:-20}"
shift $(($# < 2 ? $# : 2))
case "$target" in
  job_spec | checkpoint_manifest | token_file | safetensors_writer) ;;
  *)
    echo "unknown fuzz target '$target' (allowed: job_spec, checkpoint_manifest, token_file," \
      "safetensors_writer)" >&2
    exit 2
    ;;
esac
build="${FURNACE_FUZZ_BUILD:-$src/build-fuzz}"
bin="$build/bin/${target}_fuzz"
if [ ! -x "$bin" ]; then
  echo "SKIPPED: $bin is not built (tests/fuzz/build.sh builds it with clang)"
  exit 77
fi
work="$build/corpus/$target"
artifacts="$build/artifacts/$target/"
mkdir -p "$work" "$artifacts"
echo "[fuzz] $target for ${seconds}s: $bin $work $src/tests/fuzz/$target/corpus"
status=0
# -error_exitcode: libFuzzer's default, 77, is what ctest reads as "skipped".
"$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -max_len=4096 -error_exitcode=1 \
  -print_final_stats=1 -artifact_prefix="$artifacts" "$@" \
  "$work" "$src/tests/fuzz/$target/corpus" || status=$?
if [ "$status" -ne 0 ]; then
  echo "[fuzz] $target FAILED (exit $status); the input is in $artifacts:" >&2
  ls -1 "$artifacts" >&2 || true
  echo "[fuzz] make it a regression: cp <input> $src/tests/fuzz/$target/regressions/ and fix" >&2
fi
exit "$status"
