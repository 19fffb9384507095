#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz into build-fuzz/ with clang (Debian 12: clang-14 and
# libclang-rt-14-dev, installed by scripts/setup.sh), AddressSanitizer and UBSan. Only the
# libraries the targets need are compiled (protos, base, spec, checkpoint, data), not the rest of
# the tree. Run by scripts/test.sh; tests/fuzz/run.sh runs a target.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(job_spec_fuzz checkpoint_manifest_fuzz token_file_fuzz safetensors_writer_fuzz)
if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DFURNACE_FUZZ=ON -DFURNACE_BUILD_TESTS=OFF -DFURNACE_ENABLE_CUDA=OFF >/dev/null
fi
echo "[fuzz] building ${targets[*]} (clang, libFuzzer + ASan + UBSan) in build-fuzz/"
cmake --build build-fuzz -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}"
