"""Reading the EAGLE-3 draft's first step out of a running vLLM engine (test support).

Data flow position: observes **target taps -> draft** inside the worker. For every proposal vLLM's EAGLE
proposer (``v1/spec_decode/llm_base_proposer.py``) calls ``model.combine_hidden_states(aux)`` (the draft's
``fc`` on ``cat(taps)``), then ``model(input_ids=..., positions=..., hidden_states=...)`` once for the first
draft step over every new token, then more forwards for later steps. :func:`install_draft_recorder` wraps
``combine_hidden_states`` and hooks the draft model so that, for each proposal, the FIRST forward is kept:
its inputs (the aux rows before ``fc``, the token ids the draft read, positions) and vLLM's own
``compute_logits`` of its output at EVERY row (the proposer itself only computes the rows it samples from;
this runs the same method on all rows, observation only). :func:`recorded_draft_calls` returns them.

Both run in the worker through ``LLM.collective_rpc`` (importable module functions, shipped by reference;
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` lets the tensors come back).
"""

from __future__ import annotations

from typing import Any

import torch

_ATTR = "_vllm_eagle3_draft_records"


def _draft_model(worker: Any) -> torch.nn.Module:
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None or not hasattr(drafter, "model"):
        raise RuntimeError("this engine has no EAGLE drafter (start it with a speculative_config)")
    return drafter.model


def install_draft_recorder(worker: Any) -> str:
    """Record the first draft forward of every proposal (idempotent); returns the draft model's class name."""
    model = _draft_model(worker)
    if getattr(model, _ATTR, None) is None:
        records: list[dict[str, torch.Tensor]] = []
        combine = model.combine_hidden_states

        def combine_and_record(hidden_states: torch.Tensor) -> torch.Tensor:
            out = combine(hidden_states)
            records.append({"aux": hidden_states.detach().to("cpu", copy=True)})
            return out

        def hook(module, args, kwargs, output):
            if not records or "logits" in records[-1]:
                return  # a later draft step of the same proposal
            rec = records[-1]
            n = rec["aux"].shape[0]
            post_norm = output[0] if isinstance(output, tuple) else output
            with torch.no_grad():
                logits = module.compute_logits(post_norm[:n])
            rec.update(
                input_ids=kwargs["input_ids"][:n].detach().to("cpu", copy=True),
                positions=kwargs["positions"][:n].detach().to("cpu", copy=True),
                post_norm=post_norm[:n].detach().to("cpu", copy=True),
                logits=logits.detach().to("cpu", copy=True),
            )

        model.combine_hidden_states = combine_and_record
        model.register_forward_hook(hook, with_kwargs=True)
        setattr(model, _ATTR, records)
    getattr(model, _ATTR).clear()
    return type(model).__name__


def recorded_draft_calls(worker: Any) -> list[dict[str, torch.Tensor]]:
    """Every recorded proposal's first draft step: ``aux`` [T, n*H] (before fc), ``input_ids`` [T] (the tokens the
    draft read: the target's, shifted by one), ``positions`` [T], ``post_norm`` [T, H], ``logits`` [T, V] over the
    TARGET vocabulary (vLLM maps the draft vocabulary through ``d2t``; other entries are -inf). Oldest first."""
    return list(getattr(_draft_model(worker), _ATTR, None) or [])
