#!/usr/bin/env bash
# Creates SGLang's own venv for the cross-engine parity tests (tests/parity/test_sglang_parity.py), from nothing:
# sglang 0.5.23 + exact pins from tests/parity/sglang_harness/requirements.txt, all with --no-deps (a plain
# `pip install sglang==0.5.23` resolves CUDA torch 2.14 and ~25 nvidia-* wheels: several GB, unusable on CPU).
# torch 2.13.0+cpu comes from the machine's local wheel folder (pip's configured find-links), as for .venv.
# Never shares anything with vLLM's .venv. Idempotent: skips when the venv matches the pins and imports.
#   usage: scripts/setup_sglang_env.sh [VENV_DIR]      (default: .venv-sglang; PYTHON=python3.11 to choose python)
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
venv=${1:-.venv-sglang}
py=${PYTHON:-python3}
req=tests/parity/sglang_harness/requirements.txt
stamp="$venv/.sglang-env-complete"
want=$(sha256sum "$req" | cut -d' ' -f1)
# sglang imports torchvision, whose CUDA-linked PyPI wheel needs the harness shims (tests/parity/sglang_harness/shims.py).
check='import sys; sys.path.insert(0, "tests/parity/sglang_harness"); import shims; shims.install(); import sglang, torch, transformers; assert sglang.__version__ == "0.5.23", sglang.__version__; assert torch.__version__.startswith("2.13.0"), torch.__version__; print("[sglang-env] sglang", sglang.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__)'

quick='import importlib.metadata as m; assert m.version("sglang") == "0.5.23" and m.version("torch").startswith("2.13.0")'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "$quick" 2>/dev/null; then
  echo "[sglang-env] $venv is complete (pins unchanged): skipping"
  exit 0
fi

start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  echo "[sglang-env] creating $venv with $($py --version 2>&1)"
  "$py" -m venv "$venv"
fi
echo "[sglang-env] installing $(grep -cv '^#' "$req") pinned packages into $venv (--no-deps, torch 2.13.0+cpu from the local wheel folder)"
log="$venv/.sglang-env-pip.log"
if ! "$venv/bin/pip" install -q --no-deps --disable-pip-version-check -r "$req" >"$log" 2>&1; then
  grep -v "is ignored: it is neither" "$log" >&2 || true
  echo "[sglang-env] ERROR: pip install failed (log: $log); torch 2.13.0+cpu must be reachable (local wheel folder)" >&2
  exit 1
fi
"$venv/bin/python" -c "$check"
# The pins must be the whole environment: no CUDA wheel may have slipped in.
if "$venv/bin/pip" list 2>/dev/null | grep -Ei '^(nvidia-|cuda-|torchaudio |torchcodec )'; then
  echo "[sglang-env] ERROR: CUDA packages found in $venv (listed above); remove them or rebuild: rm -rf $venv" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "[sglang-env] done in $(( $(date +%s) - start )) s"
