#!/usr/bin/env bash
# Installs everything Furnace needs to build, test and run on Debian 12. Idempotent: packages that
# are already present are skipped, so a second run costs a few seconds.
# --no-web: skip the dashboard's packages and web/node_modules (tests/gpu/run.sh: a GPU host needs
# neither, and may have no route to the npm registry).
set -euo pipefail
with_web=1
for arg in "$@"; do
  case "$arg" in
    --no-web) with_web=0 ;;
    *) echo "setup.sh: unknown argument '$arg' (allowed: --no-web)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build ccache pkgconf git ca-certificates
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev nlohmann-json3-dev libyaml-cpp-dev libgtest-dev libgmock-dev
  libgloo-dev libcivetweb-dev libopenblas-dev libsqlite3-dev sqlite3 libcli11-dev libbenchmark-dev
  zlib1g-dev  # CRC-32 of checkpoint shards (zlib's crc32, several GB/s)
  prometheus-cpp-dev  # the controller's /metrics families and text serializer (prometheus-cpp::core)
  libsentencepiece-dev  # subword tokenizers: furnace data tokenizer train / prepare (runtime/data)
  libssl-dev  # SHA-256 of tokenizer models, `furnace certs init` (libcrypto)
  python3 procps curl
  xz-utils  # tests/gpu/bundle.sh packs the GPU archive with xz (not in minimal images)
  iproute2  # ip netns, veth, bridge, tc: emulated hosts (chaos.multihost_cut, two_node_test)
  python3-numpy  # tests/reference/megatron_indexed.py, the independent indexed-dataset writer
  clang-format  # the formatting check in the test command (Debian 12: clang-format 14)
  prometheus  # promtool (metrics tests) and the server (scrape test); 12 packages without recommends
  # tests/fuzz: clang-14 and its runtime libraries (libFuzzer, ASan, UBSan), a separate build-fuzz/.
  clang libclang-rt-14-dev
  # tests/deploy: systemd-analyze verify on the units, shellcheck on the Slurm script, PyYAML for
  # the manifest checks.
  systemd shellcheck python3-yaml
)

# The dashboard (web/): node/npm to fetch its charting library, chromium to test the page headless.
if ((with_web)); then
  packages+=(chromium fonts-dejavu-core)
  command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  # Through env: sudo's env_reset would drop an exported DEBIAN_FRONTEND, and a debconf question
  # would then wait, hidden by -qq.
  as_root=(env DEBIAN_FRONTEND=noninteractive)
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || {
      echo "[setup] installing packages needs root: run this as root, or install sudo" >&2
      exit 1
    }
    as_root=(sudo env DEBIAN_FRONTEND=noninteractive)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The prometheus package starts its server (0.0.0.0:9090, no authentication) at boot; the
  # tests need only promtool and start their own server on a free port.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    "${as_root[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
else
  echo "[setup] all packages present"
fi

((with_web)) || exit 0
# web/node_modules from the committed lock file; skipped while it is up to date.
web_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/web"
if [ "$web_dir/node_modules/.package-lock.json" -nt "$web_dir/package-lock.json" ]; then
  echo "[setup] web/node_modules up to date"
else
  echo "[setup] npm ci (web/)"
  npm ci --prefix "$web_dir" --no-audit --no-fund --loglevel=error >/dev/null
fi
