"""Soak (slow, not in CI: `pytest -m slow tests/e2e/test_soak.py`): 10 minutes of mixed traffic against one
speculative server — every sampling option, streaming with early disconnects, long and short prompts, n > 1.

Guards issue 13: one sampling option sent to a speculative server killed its engine on main; a soak is how an
operator finds the next one, and a slow leak. Pass: zero 5xx and transport errors, resident memory of the server's
process tree within 200 MiB of its first post-warm-up sample, greedy reference output unchanged, /health 200.
BENCHMARKS.md renders the result file this writes (bench/soak.json) and links its per-process memory plot
(bench/soak_rss.png). Before ``vllm-eagle3 serve`` fixed glibc's malloc thresholds on vLLM-CPU the memory check
failed: the worker's heap grew ~30 MiB/min (see ``vllm_eagle3.tools.vllm_cpu.allocator_setting``).
"""

import os

import pytest

from vllm_eagle3.tools.soak import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_ten_minutes_of_mixed_traffic():
    duration = os.environ.get("VLLM_EAGLE3_SOAK_S", "600")
    assert main(["--duration", duration]) == 0
