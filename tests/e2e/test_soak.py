"""Soak (slow, not in CI: `pytest -m slow tests/e2e/test_soak.py`): 10 minutes of mixed traffic against one
speculative server — every sampling option, streaming with early disconnects, long and short prompts, n > 1.

Guards issue 13: one sampling option sent to a speculative server killed its engine on main; a soak is how an
operator finds the next one, and a slow leak. Pass: zero 5xx and transport errors, resident memory of the server's
process tree within 200 MiB of its first post-warm-up sample and within 20 MiB over the second half of the samples
(it must level off), greedy reference output unchanged, /health 200. BENCHMARKS.md renders the result file this
publishes (``--publish``: bench/soak.json) and links its per-process memory plot (bench/soak_rss.png). The memory
checks failed twice before ``vllm-eagle3 serve`` set, on vLLM-CPU, glibc's malloc thresholds (the worker's heap
fragmenting, ~30 MiB/min) and then oneDNN's primitive cache size (a kernel per new batch size, ~20 MiB/min): see
``vllm_eagle3.tools.serve.vllm_cpu.glibc_malloc_setting`` and ``onednn_cache_setting``.
"""

import os

import pytest

from vllm_eagle3.tools.soak import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_ten_minutes_of_mixed_traffic():
    duration = os.environ.get("EAGLE3_SOAK_S", "600")
    assert main(["--duration", duration, "--publish"]) == 0
