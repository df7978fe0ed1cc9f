#!/usr/bin/env bash
# The native SHA-256 known-answer test (single-stream and interleaved kernels):
# built for this machine and run on every transform it has, then cross-compiled
# for arm64 and run under qemu, once forcing the ARMv8 crypto transform and once
# the portable one. The disk pages' checksum (CRC-32C) test likewise, on the
# host's and arm64's CRC instructions against the table. Run from the repository root.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."  # paths below are relative to the repo root

host_dir="${HOST_BUILD_DIR:-build/kat}"
cmake -S packages/kv-core-cpp -B "${host_dir}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKVCORE_PYTHON=OFF -DKVCORE_BUILD_TESTS=ON
cmake --build "${host_dir}" --target sha256_kat checksum_kat
echo "== sha256_kat (host, every available transform)"
"${host_dir}/sha256_kat"
echo "== checksum_kat (host)"
"${host_dir}/checksum_kat"

# The cross toolchain and qemu come from Debian; install them when missing and we can.
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user >/dev/null
  else
    echo "arm64: needs Debian's g++-aarch64-linux-gnu and qemu-user (apt-get install them as root)" >&2
    exit 1
  fi
fi

build_dir="${BUILD_DIR:-build/arm64}"
sysroot=/usr/aarch64-linux-gnu

cmake -S packages/kv-core-cpp -B "${build_dir}" -G Ninja \
  -DKVCORE_PYTHON=OFF -DKVCORE_BUILD_TESTS=ON \
  -DCMAKE_TOOLCHAIN_FILE="${PWD}/packages/kv-core-cpp/cmake/aarch64-linux-gnu.cmake"
cmake --build "${build_dir}" --target sha256_kat checksum_kat

# -cpu max enables the SHA-2 extension, so HWCAP_SHA2 is reported; the test
# asserts the transform named by KVCORE_SHA256 is the one actually active.
for transform in armv8 portable; do
  echo "== sha256_kat (arm64, KVCORE_SHA256=${transform})"
  KVCORE_SHA256="${transform}" qemu-aarch64 -cpu max -L "${sysroot}" "${build_dir}/sha256_kat"
done

# -cpu max has the CRC32 extension too (HWCAP_CRC32): the instructions' path must be the one run.
echo "== checksum_kat (arm64, CRC instructions)"
KVCORE_CHECKSUM_HARDWARE=1 qemu-aarch64 -cpu max -L "${sysroot}" "${build_dir}/checksum_kat"
