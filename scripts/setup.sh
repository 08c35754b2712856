#!/usr/bin/env bash
# setup.sh — on a fresh Debian 12 machine: install dependencies (Debian's packages; then torch, transformers and the
# hyperpar Python package in .venv, unless HP_NO_PYTHON=1), build, and run `hyperpar demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ "${HP_NO_PYTHON:-0}" != 1 ]; then bash scripts/install-python.sh; fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
./build/hyperpar demo
