#!/usr/bin/env bash
# Installs everything Furnace needs to build, test and run on Debian 12. Idempotent: packages that
# are already present are skipped, so a second run costs a few seconds.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkgconf git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev nlohmann-json3-dev libyaml-cpp-dev libgtest-dev libgmock-dev
  libgloo-dev libcivetweb-dev libopenblas-dev libsqlite3-dev sqlite3 libcli11-dev libbenchmark-dev
  python3 procps curl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi
