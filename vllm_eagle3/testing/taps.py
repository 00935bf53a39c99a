"""Reading the tap tensors out of a running vLLM engine (test support).

Data flow position: observes **target forward -> taps** inside the worker. vLLM's runner calls the target model
and, with an EAGLE-3 draft, receives ``(hidden_states, [aux_0, aux_1, ...])`` — the aux list in the order the draft's
``fc`` will concatenate it (the online check's extra taps follow; :func:`spec_taps_of`). :func:`install_recorder` adds
a forward hook on the target that keeps a copy of the draft's part for every forward; :func:`recorded_taps` returns
them. Both run in the worker through ``LLM.apply_model`` (they live in this importable module so vLLM can ship them by
reference; set ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` so the tensors can come back).
"""

from __future__ import annotations

import torch

_ATTR = "_vllm_eagle3_tap_records"


def spec_taps_of(model: torch.nn.Module, aux: list[torch.Tensor]) -> list[torch.Tensor]:
    """The part of the target's aux list the draft gets: the spec's taps. The capture model returns the online check's
    extra taps after them (the runner hook takes those off before the draft runs, vllm_eagle3/online/runners.py)."""
    lm = getattr(model, "language_model", model)
    n = len(getattr(getattr(lm, "model", None), "capture_taps", ()) or aux)
    return aux[:n]


def install_recorder(model: torch.nn.Module) -> str:
    """Record the draft's ``[aux tensors]`` (:func:`spec_taps_of`) of every forward of the target ``model``
    (idempotent); returns its class name."""
    if getattr(model, _ATTR, None) is None:
        records: list[list[torch.Tensor]] = []

        def hook(module, args, output):
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                records.append([t.detach().to("cpu", copy=True) for t in spec_taps_of(model, output[1])])

        model.register_forward_hook(hook)
        setattr(model, _ATTR, records)
    getattr(model, _ATTR).clear()
    return type(model).__name__


def recorded_taps(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Every recorded forward's aux list (each tensor ``[num_tokens, hidden]``), oldest first."""
    return list(getattr(model, _ATTR, None) or [])


def assert_is_tap(
    got: torch.Tensor,
    states,
    tap: int,
    *,
    rel: float | None = None,
    atol: float | None = None,
    rtol: float = 0.0,
    neighbour: float | None = None,
    where: str = "",
) -> float:
    """``got`` is transformers' ``hidden_states[tap]`` (``states[tap][0]``) and not a neighbouring layer's: the one
    check every capture test makes. Returns the relative difference ``max |got - want| / max |want|``.

    - tap 0 (``embed``): bit-identical (both engines look up the same embedding rows);
    - other taps: ``rel`` (max abs difference over max |value|, the scale-free form) or ``atol`` / ``rtol``
      (element-wise, ``torch.allclose``); the calling test justifies its tolerance in its docstring;
    - each neighbour k +- 1 must be farther than ``neighbour`` (same measure as the tolerance; default 100x it), so
      an off-by-one capture cannot pass and a tolerance too loose to tell layers apart fails the test."""
    assert (rel is None) != (atol is None), "give rel or atol"
    label = "embed" if tap == 0 else str(tap)
    where = f"{where} tap {label}".strip()
    want = states[tap][0]
    assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != transformers {tuple(want.shape)}"
    scale = want.abs().max().item()
    diff = (got - want).abs().max().item()
    relative = diff / scale
    print(f"{where}: max abs diff {diff:.3g}, / max |value| = {relative:.3g} (values up to {scale:.3g})", flush=True)
    if tap == 0:
        assert torch.equal(got, want), f"{where} is not bit-identical to transformers' hidden_states[0] ({diff:.3g})"
    elif rel is not None:
        assert relative <= rel, f"{where}: relative difference {relative:.3g} > {rel} vs hidden_states[{tap}]"
    else:
        assert torch.allclose(got, want, atol=atol, rtol=rtol), (
            f"{where} vs transformers hidden_states[{tap}]: max abs diff {diff:.3g} (atol {atol}, rtol {rtol})"
        )
    floor = neighbour if neighbour is not None else 100 * (rel if rel is not None else atol)
    for other in (tap - 1, tap + 1):
        if 0 <= other < len(states):
            far = (got - states[other][0]).abs().max().item() / (scale if rel is not None else 1.0)
            assert far > floor, (
                f"{where} is also within {far:.3g} of hidden_states[{other}]: the tolerance cannot "
                "tell neighbouring taps apart"
            )
    return relative


def prefill_taps(engine, ids: list[int]) -> list[torch.Tensor]:
    """The aux list a running offline engine (``vllm_eagle3.tools.engine.Engine`` with an EAGLE-3 draft) hands its
    draft for the prefill of ``ids``: the recorder installed, one greedy token generated, the forward over exactly
    ``len(ids)`` tokens picked out."""
    from vllm import SamplingParams

    engine.llm.apply_model(install_recorder)
    engine.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    records = engine.llm.apply_model(recorded_taps)[0]
    prefill = [r for r in records if r and r[0].shape[0] == len(ids)]
    assert prefill, (
        f"no forward over the {len(ids)}-token prompt recorded; got shapes "
        f"{[[tuple(t.shape) for t in r] for r in records]}"
    )
    return prefill[0]
