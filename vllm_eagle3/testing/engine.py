"""Test support around an offline vLLM engine: the engine itself (re-exported from ``vllm_eagle3.tools.engine``),
the capture tests' prompt, and functions run in the workers through ``LLM.collective_rpc``.
"""

from __future__ import annotations

from typing import Any

from vllm_eagle3.tools.engine import Engine, counter_totals, start_engine, stop_engine

__all__ = [
    "Engine",
    "PROMPT",
    "counter_totals",
    "prompt_ids",
    "start_engine",
    "stop_engine",
    "worker_applied_patches",
    "worker_attention_builders",
    "worker_mla_verify_calls",
]

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
"""The prompt of every capture test; its token ids are its UTF-8 bytes (tiny byte-level tokenizer)."""


def prompt_ids(text: str = PROMPT) -> list[int]:
    return list(text.encode())


def worker_applied_patches(worker: Any) -> list[str]:
    """``LLM.collective_rpc`` target: the model patches this worker process applied or skipped (one line each)."""
    from vllm_eagle3.model_patches import applied_patches

    return applied_patches()


def worker_mla_verify_calls(worker: Any) -> dict[str, int]:
    """``LLM.collective_rpc`` target: how often this worker ran
    vllm_eagle3/model_patches/vllm_cpu_mla_verify_decode.py's path."""
    from vllm_eagle3.model_patches.vllm_cpu_mla_verify_decode import CALLS

    return dict(CALLS)


def worker_attention_builders(worker: Any) -> dict[str, str]:
    """``LLM.collective_rpc`` target: attention backend name -> metadata builder class this worker's runner uses
    (e.g. ``CPU_MLA`` -> ``CPUMLAVarlenDecodeBuilder`` with the MLA verify-as-decode patch, vLLM's own otherwise)."""
    return {
        g.backend.get_name(): type(g.get_metadata_builder()).__name__
        for groups in worker.model_runner.attn_groups
        for g in groups
    }
