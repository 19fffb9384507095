#!/usr/bin/env bash
# Emulated two-node topology for bench_parm and the two-node test: network namespaces furnace_n0
# and furnace_n1 joined by one veth pair (10.77.0.1/24 <-> 10.77.0.2/24), lo up in both, each veth
# end rate-limited by a tbf qdisc (so both directions are), optionally behind a netem delay.
# Traffic between two processes of one namespace stays on that namespace's loopback route (fast);
# traffic between the namespaces crosses the limited veth, the "inter-node link".
#
#   bench/parm/two_nodes.sh up [--rate 1gbit] [--delay 0ms]   (idempotent: rebuilds from scratch)
#   bench/parm/two_nodes.sh down                              (removes everything `up` made)
#   bench/parm/two_nodes.sh status
# Needs root and iproute2. netem is optional (BENCHMARKING.md: it does not work on every machine);
# a delay that cannot be applied is an error, not silently dropped.
set -euo pipefail

NS=(furnace_n0 furnace_n1)
DEV=(fveth0 fveth1)
ADDR=(10.77.0.1/24 10.77.0.2/24)

down() {
  for ns in "${NS[@]}"; do
    if ip netns list | grep -qw "$ns"; then ip netns del "$ns"; fi
  done
  # A veth end left in the root namespace (an interrupted `up`) takes its peer with it.
  if ip link show "${DEV[0]}" >/dev/null 2>&1; then ip link del "${DEV[0]}"; fi
  if ip link show "${DEV[1]}" >/dev/null 2>&1; then ip link del "${DEV[1]}"; fi
}

up() {
  local rate=$1 delay=$2
  down
  for ns in "${NS[@]}"; do ip netns add "$ns"; done
  ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
  for i in 0 1; do
    local ns=${NS[$i]} dev=${DEV[$i]}
    ip link set "$dev" netns "$ns"
    ip -n "$ns" addr add "${ADDR[$i]}" dev "$dev"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" up
    if [[ "$delay" != "0ms" && "$delay" != "0" ]]; then
      if ! ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay"; then
        down
        echo "two_nodes: netem is not available here; run without --delay" >&2
        exit 1
      fi
      ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: \
        tbf rate "$rate" burst 256kb latency 100ms
    else
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 100ms
    fi
  done
  echo "two_nodes: up (${NS[*]}, rate $rate, delay $delay)"
}

status() {
  for i in 0 1; do
    echo "== ${NS[$i]}"
    ip netns exec "${NS[$i]}" ip -brief addr
    ip netns exec "${NS[$i]}" tc qdisc show dev "${DEV[$i]}"
  done
}

cmd=${1:-}
shift || true
rate=1gbit
delay=0ms
while [[ $# -gt 0 ]]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    *) echo "two_nodes: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $cmd in
  up) up "$rate" "$delay" ;;
  down) down; echo "two_nodes: down" ;;
  status) status ;;
  *) echo "usage: $0 up|down|status [--rate 1gbit] [--delay 0ms]" >&2; exit 2 ;;
esac
