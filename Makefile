# vllm-eagle3 — every target installs what it needs by itself.
#   make demo   serve the bundled miniature Kimi K2.5 with its EAGLE-3 head and show it working
#   make test   the whole test suite (unit, parity incl. SGLang, e2e)
# The interpreter the venvs are made with: make PY=python3.11 (or PYTHON=python3.11 in the environment).
PY      ?= $(or $(PYTHON),python3)
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.vllm-eagle3-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_USAGE_SOURCE := vllm-eagle3
export VLLM_NO_USAGE_STATS := 1
export DO_NOT_TRACK := 1

.PHONY: setup sglang-env sglang-legacy-env test test-unit demo selftest bench compat clean

$(STAMP): pyproject.toml scripts/setup_venv.sh
	PYTHON=$(PY) bash scripts/setup_venv.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

sglang-env:
	PYTHON=$(PY) bash scripts/setup_sglang_env.sh

# SGLang 0.5.12.post1, the newest release with the legacy EAGLE-3 id rule (tests/parity/test_sglang_legacy.py)
# (seeded from .venv-sglang: the pins differ only in sglang, transformers, tokenizers)
sglang-legacy-env: sglang-env
	PYTHON=$(PY) bash scripts/setup_sglang_env.sh .venv-sglang-legacy tests/parity/sglang_harness/requirements-legacy.txt .venv-sglang

# ruff lint and format check first (pyproject's [tool.ruff], seconds), then pytest. Prints the 30 slowest tests
# and the whole time, installs included (docs/testing.md says what to expect). Two pytest-xdist workers, one per core of CI's 2-core box
# (tests/conftest.py groups the tests that share a server).
# The vLLM venv and the two SGLang venvs install side by side (-j2: pip is one process each, mostly unpacking).
TEST_WORKERS ?= 2
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory -j2 setup sglang-legacy-env \
	  && echo "make test: installs done in $$(( $$(date +%s) - start )) s" \
	  && $(VPY) -m ruff check . && $(VPY) -m ruff format --check . && echo "make test: ruff check and format passed" \
	  && $(VPY) -m pytest -v -n $(TEST_WORKERS) --no-loadscope-reorder --durations=30 tests; rc=$$?; \
	  echo "make test: $$(( $$(date +%s) - start )) s in all, installs included (exit code $$rc)"; exit $$rc

test-unit: setup
	$(VPY) -m pytest -v -m unit tests

demo: setup
	$(VENV)/bin/vllm-eagle3 demo

# The operator's check of the serving box, on vLLM-CPU's own runner (V1) and on Model Runner V2 (GPU vLLM's runner,
# its Triton kernels interpreted); tests/e2e/test_model_runner_v2.py runs both in `make test`.
selftest: setup
	$(VENV)/bin/vllm-eagle3 selftest && $(VENV)/bin/vllm-eagle3 emulate v2 -- $(VENV)/bin/vllm-eagle3 selftest

# The default plan (~1 h on a quiet 2-core box; `make bench BENCH_ARGS=--dry-run` prints the plan and estimate,
# BENCH_ARGS="--no-compiled" or "--concurrency 1 4 16 32" shrink or grow it). Waits for other engines holding the lock.
# Writes ~/.cache/vllm-eagle3/bench-default/; BENCH_ARGS=--publish also the repository's BENCHMARKS.md and results.
BENCH_ARGS ?=
bench: setup
	flock /tmp/vllm-engine.lock $(VENV)/bin/vllm-eagle3 bench $(BENCH_ARGS)

# Checks every vLLM name the plugin relies on (vllm_eagle3/tools/compat_table.py) against the published vLLM wheels'
# sources (downloaded into .cache/compat, ~1 GB, not installed); writes bench/compat/results.json, which
# tests/unit/test_compat_results.py holds pyproject's gpu extra and compat.SUPPORTED_VLLM to.
compat: setup
	$(VPY) -m vllm_eagle3.tools.compat_check $(COMPAT_ARGS)

clean:
	rm -rf $(VENV) .venv-sglang .venv-sglang-legacy .pytest_cache
