#!/usr/bin/env bash
# install-python.sh — the Python side: a virtual environment in .venv (Debian's python3 refuses system-wide pip
# installs) with torch, transformers and accelerate from PyPI (PyPI's Linux torch is the CUDA build, about 4 GB; it
# runs on CPU with gloo) and the hyperpar package itself (pip install ./python, which builds libhyperpar_c.so).
# scripts/test.sh uses .venv when it is there. HP_VENV names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HP_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch, transformers and accelerate (transformers loads a DistributedConfig model through accelerate): the
# versions the tests were written against, or newer.
"$VENV/bin/python" -m pip install -q "torch>=2.4" "transformers>=5.0" accelerate
# tokenizers: tests/python/test_tokenize.py compares `hyperpar tokenize` with it (transformers brings it too).
"$VENV/bin/python" -m pip install -q "tokenizers>=0.23"
"$VENV/bin/python" -m pip install -q ./python
echo "install-python: $("$VENV/bin/python" -c 'import torch, transformers, hyperpar; print("torch", torch.__version__, "transformers", transformers.__version__, "hyperpar", hyperpar.__file__)')"
