#!/usr/bin/env bash
# Creates one SGLang venv for the cross-engine parity tests (tests/parity/test_sglang_*.py), from nothing: the
# sglang release and exact pins of a requirements file, all with --no-deps (a plain `pip install sglang==X`
# resolves CUDA torch and ~25 nvidia-* wheels: several GB, unusable on CPU). Two are used (Makefile):
#   .venv-sglang         tests/parity/sglang_harness/requirements.txt         sglang 0.5.23 (current capture rule)
#   .venv-sglang-legacy  tests/parity/sglang_harness/requirements-legacy.txt  sglang 0.5.12.post1 (legacy +1 rule)
# torch 2.13.0+cpu comes from the machine's local wheel folder (pip's configured find-links), as for .venv.
# Never shares anything with vLLM's .venv. Idempotent: skips when the venv matches the pins (stamp) and imports.
#   usage: scripts/setup_sglang_env.sh [VENV_DIR [REQUIREMENTS [SEED_VENV]]]   (default: .venv-sglang +
#          requirements.txt; PYTHON=python3.11 or `make PY=python3.11` to choose python)
# SEED_VENV (the Makefile passes .venv-sglang for the legacy venv): a new venv starts as a hard-linked copy of that
# complete venv (seconds, no extra disk), then the same `pip install --no-deps -r REQUIREMENTS` replaces only the
# pins that differ (3 of 96 for the legacy venv) instead of unpacking torch again (~2 min of 2 CI cores). pip
# never writes into an installed file (it removes and creates), so the seed is left as it was.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
cd "$(dirname "$0")/.."
venv=${1:-.venv-sglang}
py=${PYTHON:-python3}
req=${2:-tests/parity/sglang_harness/requirements.txt}
seed=${3:-}
version=$(sed -n 's/^sglang==//p' "$req")
[ -n "$version" ] || { echo "[sglang-env] ERROR: $req pins no sglang==VERSION" >&2; exit 1; }
stamp="$venv/.sglang-env-complete"
want=$(sha256sum "$req" | cut -d' ' -f1)
# sglang imports torchvision, whose CUDA-linked PyPI wheel needs the harness shims (tests/parity/sglang_harness/shims.py).
check='import sys; sys.path.insert(0, "tests/parity/sglang_harness"); import shims; shims.install(); import sglang, torch, transformers; assert sglang.__version__ == "'"$version"'", sglang.__version__; assert torch.__version__.startswith("2.13.0"), torch.__version__; print("[sglang-env] sglang", sglang.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__)'

quick='import importlib.metadata as m; assert m.version("sglang") == "'"$version"'" and m.version("torch").startswith("2.13.0")'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "$quick" 2>/dev/null; then
  echo "[sglang-env] $venv is complete (pins unchanged): skipping"
  exit 0
fi

start=$(date +%s)
if [ ! -x "$venv/bin/python" ] && [ -n "$seed" ] && [ -f "$seed/.sglang-env-complete" ] \
    && { rm -rf "$venv"; cp -al "$seed" "$venv" 2>/dev/null || { rm -rf "$venv"; false; }; }; then
  echo "[sglang-env] created $venv as a hard-linked copy of $seed"
  rm -f "$venv/.sglang-env-complete" "$venv/.sglang-env-pip.log"  # the seed's own files, never written through
  # bin/ scripts (pip, activate, ...) name the seed's path: point them at this venv (sed -i writes a new file, so
  # the seed's hard-linked originals stay as they are).
  from=$(cd "$seed" && pwd -P); to=$(cd "$venv" && pwd -P)
  grep -lIF "$from" "$venv"/bin/* 2>/dev/null | xargs -r sed -i "s#$from#$to#g"
elif [ ! -x "$venv/bin/python" ]; then
  echo "[sglang-env] creating $venv with $($py --version 2>&1)"
  "$py" -m venv "$venv"
fi
echo "[sglang-env] installing $(grep -cv '^#' "$req") pinned packages (sglang $version) into $venv (--no-deps, torch 2.13.0+cpu from the local wheel folder)"
# pip's whole output goes to the log; each package it fetches and what it installs are shown as they happen.
log="$venv/.sglang-env-pip.log"
step=$(date +%s) rc=0
"$venv/bin/python" -m pip install --progress-bar off --no-deps --disable-pip-version-check -r "$req" 2>&1 \
  | tee "$log" | grep --line-buffered -E "^(Collecting|Processing|Installing collected|Successfully installed|ERROR)" \
  | sed -u 's/^/[sglang-env]   /' || rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  grep -v "is ignored: it is neither" "$log" >&2 || true
  echo "[sglang-env] ERROR: pip install failed (log: $log); torch 2.13.0+cpu must be reachable (local wheel folder)" >&2
  exit 1
fi
echo "[sglang-env] pip install: done in $(( $(date +%s) - step )) s; checking that sglang, torch, transformers import"
step=$(date +%s)
"$venv/bin/python" -c "$check"
echo "[sglang-env] import check: done in $(( $(date +%s) - step )) s"
# The pins must be the whole environment: no CUDA wheel may have slipped in.
if "$venv/bin/python" -m pip list 2>/dev/null | grep -Ei '^(nvidia-|cuda-|torchaudio |torchcodec )'; then
  echo "[sglang-env] ERROR: CUDA packages found in $venv (listed above); remove them or rebuild: rm -rf $venv" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "[sglang-env] done in $(( $(date +%s) - start )) s"
