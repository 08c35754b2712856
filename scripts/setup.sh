#!/usr/bin/env bash
# setup.sh — on a fresh Debian 12 machine: install dependencies, build, and run `hyperpar demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
./build/hyperpar demo
