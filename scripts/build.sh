#!/usr/bin/env bash
# Configures and builds Furnace into build/ (Ninja, RelWithDebInfo, ccache when present).
# CUDA parts build when nvcc is found (for sm_90); elsewhere they are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
