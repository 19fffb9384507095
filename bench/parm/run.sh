#!/usr/bin/env bash
# Parm's headline benchmark, both modes side by side: builds bench_parm (or uses the build that is
# there), brings the two emulated nodes up, runs --nodes 1 (loopback) and --nodes 2 (the
# namespaces, the inter-node link at each RATE in turn), writes bench/parm/results/nodes1.json and
# nodes2-<rate>.json with the printed tables (.txt), and tears the nodes down, also on failure.
# Needs root (ip netns, tc).
#
#   bench/parm/run.sh [--quick] [--rates "1gbit 300mbit"] [--reps 7] [--build-dir build]
# About 13 minutes with the defaults on a 2-core machine (8 ranks oversubscribe the cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
rates="1gbit 300mbit"
reps=7
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) extra+=(--quick); shift ;;
    --rates) rates=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ ! -f $build/build.ninja ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$build" bench_parm

# nproc reads OMP_NUM_THREADS: ask it before the thread settings go in.
cores=$(nproc)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GOMP_SPINCOUNT=1000
out=$root/bench/parm/results
mkdir -p "$out"
trap '"$root/bench/parm/two_nodes.sh" down' EXIT
echo "== $(date -u +%FT%TZ) nproc $cores commit $(git -C "$root" rev-parse --short HEAD)"
"$build/bin/bench_parm" --nodes 1 --reps "$reps" "${extra[@]}" --json "$out/nodes1.json" \
  | tee "$out/nodes1.txt"
for rate in $rates; do
  "$root/bench/parm/two_nodes.sh" up --rate "$rate"
  "$build/bin/bench_parm" --nodes 2 --link "$rate" --reps "$reps" "${extra[@]}" \
    --json "$out/nodes2-$rate.json" | tee "$out/nodes2-$rate.txt"
done
