#!/usr/bin/env bash
# Packs, on a development machine, everything tests/gpu/run.sh needs on a GPU machine that has the
# NVIDIA driver and a CUDA runtime but none of the build's Debian packages and no package registry
# (the GPU machines this workplace lends have neither apt nor a network): the gpu-labelled test
# executables and the GPU benchmarks, built here for sm_90 and stripped, with every shared library
# they load from the build's packages (Abseil, OpenBLAS and its Fortran runtime, zlib, libstdc++),
# in one compressed archive. Left out, and found on the GPU machine by run.sh: the C library and
# the dynamic loader, the NVIDIA driver (libcuda), and the CUDA libraries that are too large to
# carry (cuBLAS, cuBLASLt, NCCL: several hundred MB; the CUDA image has them under
# /usr/local/cuda or in its Python's nvidia-* packages). Then, on the GPU machine:
#
#   bash tests/gpu/run.sh --bundle .gpu-bundle/furnace-gpu.tar.xz --budget-s 360
#
# Usage: tests/gpu/bundle.sh [--build-dir DIR] [--no-build] [-o ARCHIVE]
#   --build-dir  the CUDA build to pack (default: build; configured and the gpu targets built here
#                with FURNACE_ENABLE_CUDA=ON, so nvcc must be found)
#   --no-build   pack the build directory as it is (its gpu_tests and gpu_benches already built)
#   -o           the archive (default: .gpu-bundle/furnace-gpu.tar.xz, which .gitignore ignores)
# Prints the archive's size; exit status 1 when the build fails or a library cannot be resolved.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="build" archive="" do_build=1
while (($#)); do
  case "$1" in
    --build-dir) build_dir="$2"; shift ;;
    --no-build) do_build=0 ;;
    -o) archive="$2"; shift ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (allowed: --build-dir DIR, --no-build, -o ARCHIVE)" >&2
       exit 2 ;;
  esac
  shift
done
cd "$repo"
[ -n "$archive" ] || archive="$repo/.gpu-bundle/furnace-gpu.tar.xz"
case "$build_dir" in /*) ;; *) build_dir="$repo/$build_dir" ;; esac
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "bundle.sh: nvcc not found: the GPU code cannot be built" >&2; exit 1; }
# An archive of an earlier build must not survive a failure below and be shipped as this one.
rm -f "$archive"

if ((do_build)); then
  echo "[bundle] configure $build_dir (CUDA on, sm_90) and build gpu_tests gpu_benches" >&2
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFURNACE_ENABLE_CUDA=ON \
    >/dev/null
  cmake --build "$build_dir" -j "$(nproc)" --target gpu_tests gpu_benches >/dev/null
fi
grep -q 'FURNACE_ENABLE_CUDA:BOOL=ON' "$build_dir/CMakeCache.txt" 2>/dev/null ||
  { echo "bundle.sh: $build_dir is not a CUDA build (FURNACE_ENABLE_CUDA=ON)" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
: >"$stage/tests.txt"
: >"$stage/benches.txt"
for list in gpu_tests gpu_benches; do
  while IFS= read -r exe; do
    [ -n "$exe" ] || continue
    name="$(basename "$exe")"
    strip --strip-debug -o "$stage/bin/$name" "$exe"
    if [ "$list" = gpu_tests ]; then echo "$name" >>"$stage/tests.txt"; else echo "$name" >>"$stage/benches.txt"; fi
  done <"$build_dir/$list.txt"
done

# The libraries every executable loads at exec, resolved here, less what the GPU machine brings
# itself. The CUDA runtime is linked statically; cuBLAS and NCCL are not linked at all but opened
# on their first call (kernels/cuda/lazy_library.h), so ldd does not list them: lazy_libs.txt names
# them (their sonames, from the build's headers) for run.sh to find on the GPU machine.
carried_elsewhere='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
missing=0
for exe in "$stage"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $carried_elsewhere ]] && continue
    if [ "$path" = "not" ]; then
      echo "bundle.sh: $(basename "$exe") needs $name, which is not found here" >&2
      missing=1
      continue
    fi
    [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$exe")
done
((missing == 0)) || exit 1
# The headers the build used (its cache): cuBLAS's in the toolkit's include directory (nvcc's),
# NCCL's wherever the build found nccl.h.
cuda_include="$(dirname "$(dirname "$(command -v nvcc)")")/include"
nccl_include="$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$build_dir/CMakeCache.txt")"
cublas_major="$(awk '/#define CUBLAS_VER_MAJOR/ {print $3; exit}' "$cuda_include/cublas_api.h" || true)"
nccl_major="$(awk '/#define NCCL_MAJOR/ {print $3; exit}' "${nccl_include:-$cuda_include}/nccl.h" || true)"
if ! [[ "$cublas_major" =~ ^[0-9]+$ && "$nccl_major" =~ ^[0-9]+$ ]]; then
  echo "bundle.sh: cannot read the cuBLAS and NCCL major versions from $cuda_include/cublas_api.h" \
    "and ${nccl_include:-$cuda_include}/nccl.h (got '$cublas_major', '$nccl_major')" >&2
  exit 1
fi
printf 'libcublas.so.%s\nlibnccl.so.%s\n' "$cublas_major" "$nccl_major" >"$stage/lazy_libs.txt"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -srm) with $(nvcc --version | grep -o 'release [0-9.]*' | head -1)"
} >"$stage/BUILD"

mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cf - . | xz -T0 -6 >"$archive.tmp"
mv "$archive.tmp" "$archive"
echo "[bundle] $archive: $(du -h "$archive" | cut -f1) ($(wc -l <"$stage/tests.txt") test and" \
  "$(wc -l <"$stage/benches.txt") benchmark executables, $(ls "$stage/lib" | wc -l) libraries)" >&2
