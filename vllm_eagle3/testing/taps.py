"""Reading the tap tensors out of a running vLLM engine (test support).

Data flow position: observes **target forward -> taps** inside the worker. vLLM's runner calls the target
model and, with an EAGLE-3 draft, receives ``(hidden_states, [aux_0, aux_1, ...])`` — the aux list in the
order the draft's ``fc`` will concatenate it. :func:`install_recorder` adds a forward hook on the target
that keeps a copy of that list for every forward; :func:`recorded_taps` returns them. Both run in the worker
through ``LLM.apply_model`` (they live in this importable module so vLLM can ship them by reference; set
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` so the tensors can come back).
"""

from __future__ import annotations

import torch

_ATTR = "_vllm_eagle3_tap_records"


def install_recorder(model: torch.nn.Module) -> str:
    """Record ``[aux tensors]`` of every forward of the target ``model`` (idempotent); returns its class name."""
    if getattr(model, _ATTR, None) is None:
        records: list[list[torch.Tensor]] = []

        def hook(module, args, output):
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                records.append([t.detach().to("cpu", copy=True) for t in output[1]])

        model.register_forward_hook(hook)
        setattr(model, _ATTR, records)
    getattr(model, _ATTR).clear()
    return type(model).__name__


def recorded_taps(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Every recorded forward's aux list (each tensor ``[num_tokens, hidden]``), oldest first."""
    return list(getattr(model, _ATTR, None) or [])
