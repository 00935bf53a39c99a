"""Faults planted in a running vLLM worker, to show a check can fail (test support).

Data flow position: the verify step (target logits -> rejection sampler -> emitted tokens). Run through
``LLM.collective_rpc`` in the worker process (importable module functions, shipped by reference).

:func:`install_verify_off_by_one` makes vLLM's rejection sampler judge draft token i against the target row of draft
token i + 1 (``torch.roll`` of the verify logits by one row): a draft/verify off-by-one, the bug class that emits
tokens the target would not have chosen. :func:`remove_faults` restores vLLM's function.
"""

from __future__ import annotations

from typing import Any

_ORIGINAL = "_vllm_eagle3_original"


def install_verify_off_by_one(worker: Any) -> str:
    """Plant the off-by-one in this worker's rejection sampler (idempotent); returns what was patched."""
    import torch
    import vllm.v1.sample.rejection_sampler as rs

    if getattr(rs.rejection_sample, _ORIGINAL, None) is None:
        original = rs.rejection_sample

        def off_by_one(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            *args,
            **kwargs,
        ):
            shifted = torch.roll(target_logits, -1, dims=0).contiguous()  # [num_draft_tokens, vocab]: row i <- i+1
            return original(
                draft_token_ids,
                num_draft_tokens,
                max_spec_len,
                cu_num_draft_tokens,
                draft_probs,
                shifted,
                *args,
                **kwargs,
            )

        setattr(off_by_one, _ORIGINAL, original)
        rs.rejection_sample = off_by_one
    return "vllm.v1.sample.rejection_sampler.rejection_sample"


def remove_faults(worker: Any) -> bool:
    """Undo :func:`install_verify_off_by_one`; True when there was one."""
    import vllm.v1.sample.rejection_sampler as rs

    original = getattr(rs.rejection_sample, _ORIGINAL, None)
    if original is not None:
        rs.rejection_sample = original
    return original is not None
