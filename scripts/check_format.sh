#!/usr/bin/env bash
# Formatting check: every C++/CUDA source the project tracks must already be formatted with the
# committed .clang-format (Debian 12's clang-format 14). Lists the files that are not and exits 1.
# `scripts/check_format.sh --fix` formats them in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format not found (scripts/setup.sh installs it)"; exit 2; }
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null ||
                     find controller kernels runtime worker tests bench \
                          \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \))
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "${#bad[@]} file(s) differ from .clang-format (fix: scripts/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format: ${#files[@]} files match .clang-format"
