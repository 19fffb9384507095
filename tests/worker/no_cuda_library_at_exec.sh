#!/usr/bin/env bash
# Fails if any program given loads a CUDA library (driver, runtime, cuBLAS, NCCL) at exec, as ldd
# resolves them (tests/worker/CMakeLists.txt says why they must not).
# Usage: no_cuda_library_at_exec.sh PROGRAM...
set -uo pipefail
status=0
for exe in "$@"; do
  if ! libs="$(ldd "$exe" 2>&1)"; then
    echo "ldd $exe failed: $libs"
    status=1
    continue
  fi
  if cuda="$(grep -E 'lib(cuda|cudart|cublas|cublasLt|nccl)\.so' <<<"$libs")"; then
    echo "$exe loads a CUDA library at exec:"
    echo "$cuda"
    status=1
  fi
done
((status == 0)) && echo "none of the $# programs loads a CUDA library at exec"
exit "$status"
