#!/usr/bin/env bash
# Quick start, second command: installs what is missing, builds, runs the whole test suite
# (unit, integration, chaos and fuzz tests; the gpu label skips itself where there is no GPU).
# Extra arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
tests/fuzz/build.sh  # the libFuzzer targets (clang); the fuzz tests run each for a bounded time
# --timeout: the limit of every test that sets none of its own (TIMEOUT properties win): a hang is
# reported as that test's timeout, not a CI run killed with no name.
ctest --test-dir build --output-on-failure -j 2 --timeout 600 "$@"
