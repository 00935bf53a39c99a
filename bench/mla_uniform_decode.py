"""EXPERIMENT loader for the benchmark: apply ``model_patches/vllm_cpu_mla_verify_decode.py`` in the worker.

``vllm-eagle3 bench --experiment-mla-decode`` starts its servers with
``--worker-extension-cls bench.mla_uniform_decode.StepTimersMlaDecode``: vLLM imports this module in the worker
before it builds the model runner and its attention builders, and importing it applies the patch in that worker
process only (whatever ``VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE`` says). The patch itself, its reasoning and its
measurements are in the patch module; a server can also get it with ``VLLM_EAGLE3_CPU_MLA_VERIFY_AS_DECODE=1``.
"""

from __future__ import annotations

from model_patches.vllm_cpu_mla_verify_decode import apply_now

from vllm_eagle3.tools.bench import StepTimers


class StepTimersMlaDecode(StepTimers):
    """The benchmark's step timers, in a worker whose CPU MLA backend verifies speculative tokens as decodes."""


apply_now(force=True)
