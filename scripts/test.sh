#!/usr/bin/env bash
# Quick start, second command: installs what is missing, builds, runs the whole test suite
# (unit, integration and chaos tests; the gpu label skips itself where there is no GPU).
# Extra arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j 2 "$@"
