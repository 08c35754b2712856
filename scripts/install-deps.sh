#!/usr/bin/env bash
# install-deps.sh — every Debian 12 package hyperpar needs to build, test and fuzz. Run as root (or with sudo).
set -euo pipefail
PACKAGES=(
  build-essential cmake pkg-config   # C11 compiler, build system
  libjansson-dev                     # JSON: config.json, safetensors headers, plans
  libyaml-dev                        # YAML plan overrides
  libopenblas-dev                    # GEMM for the MoE runtime
  libdnnl-dev                        # oneDNN: the GEMM layer's backend (src/kernels)
  libopenmpi-dev openmpi-bin         # MPI: expert-parallel runtime and its tests
  clang                              # libFuzzer targets
  python3 python3-venv python3-pip   # test scripts; the Python package's virtual environment (install-python.sh)
  strace                             # tests/cli/test_stdout.sh: every write(2) of stdout and stderr ends a line
  chromium                           # renders the HTML pages of cost and advise (tests/cli/test_html.sh)
)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
echo "install-deps: installed ${PACKAGES[*]}" | tr -s ' '
