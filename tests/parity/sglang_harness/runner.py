"""Run SGLang 0.5.23's own DeepseekV2/V3 or KimiK25 model on a checkpoint and save the EAGLE-3 taps it captures.

Executed with ``.venv-sglang/bin/python`` (SGLang's isolated venv, see ``scripts/setup_sglang_env.sh``), never
imported by the main test venv. Data flow observed: target forward -> SGLang's aux capture
(``DeepseekV2Model.layers_to_capture``) -> the packed ``[tokens, K * hidden]`` aux tensor the model hands its
logits processor (which SGLang then feeds to the draft's ``fc``).

How the capture ids are set: the way SGLang's scheduler does it. ``ServerArgs(speculative_algorithm="EAGLE3",
speculative_draft_model_path=DRAFT)`` makes ``ModelRunner`` read the draft's ``config.json``
(``spec_aux_hidden_state.py`` takes ``eagle_config.eagle_aux_hidden_state_layer_ids``) and call the model's own
``set_eagle3_layers_to_capture`` in ``init_attention_backends``. The prefill is built like SGLang's
``benchmark/one_batch.py`` (``Req`` -> ``ScheduleBatch.prepare_for_extend`` -> ``ForwardBatch`` ->
``ModelRunner.forward``). A forward hook on the decoder stack (``DeepseekV2Model``) copies its
``(hidden, aux)`` output: observation only, the forward is SGLang's.

Output (``torch.save``): ``{"aux": [T, K*H] float32, "layers_to_capture": [...], "draft_ids": [...],
"embed": [T, H] (SGLang's own embedding of the input ids, or the merged multimodal embeddings),
"hidden_size", "num_layers", "input_ids", "sglang_version", "patch": {...} | None, "stub_calls": [...],
"config_overrides": {...}, "error": str | None}``. When SGLang refuses the ids (e.g. 0.5.23 given -1),
``aux`` is None and ``error`` holds SGLang's message, so the test can assert the refusal.

Shims: see ``shims.py`` (stub ``sgl_kernel`` whose calls are recorded and must stay zero; the
``torchvision::nms`` schema). Run ``--help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

#: SGLang's CPU RoPE only implements DeepSeek-YaRN (``layers/rotary_embedding/factory.py``: "Only deepseek_yarn
#: is supported for CPU for now"). YaRN with factor 1.0 is plain RoPE: no frequency is interpolated
#: (inv_freq_interpolation == inv_freq_extrapolation) and mscale(1.0) == 1, so the attention scale is unchanged.
#: The runner adds it only to a config that has no scaling; the parity test against transformers (which runs
#: the checkpoint WITHOUT it) is what proves the override changes nothing.
YARN_IDENTITY = {"rope_type": "yarn", "type": "yarn", "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
                 "mscale": 1.0, "mscale_all_dim": 1.0}


#: Keys SGLang's DeepseekV2 reads that transformers 5's ``DeepseekV3Config`` no longer writes, with the value
#: that reproduces what transformers (and vLLM) compute: every layer from ``first_k_dense_replace`` on is MoE;
#: the router is DeepSeek-V3's (sigmoid scores, group-limited top-k with the correction bias).
TEXT_DEFAULTS = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}

#: A nested ``text_config`` (Kimi K2.5) needs its own ``architectures``: SGLang's DeepseekV2 reads
#: ``hf_config.architectures[0]`` of the text config (``shared_experts_fusion_disable_reason``).
NESTED_TEXT_DEFAULTS = {"architectures": ["DeepseekV3ForCausalLM"]}

#: SGLang's Kimi K2.5 vision code reads the original checkpoint's names (``vt_hidden_size``,
#: ``init_pos_emb_*``, ``text_hidden_size``); transformers' ``Kimi_K25VisionConfig`` writes other names for the
#: same numbers. SGLang name -> transformers name.
VISION_ALIASES = {"vt_hidden_size": "hidden_size", "init_pos_emb_height": "pos_emb_height",
                  "init_pos_emb_width": "pos_emb_width", "init_pos_emb_time": "pos_emb_time"}

#: SGLang sizes its KV pool from the memory left after loading weights, as a fraction of what was free before
#: (on CPU: system memory, which other processes on a shared machine change during the load). A large fraction
#: only makes the check robust; ``max_total_tokens`` caps the pool actually allocated at a few MB.
MEM_FRACTION = 0.5


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="checkpoint folder (DeepseekV3ForCausalLM or KimiK25)")
    p.add_argument("--case", action="append", required=True, metavar="NAME=DRAFT_DIR[:legacy]",
                   help="one capture case: SGLang reads DRAFT_DIR's eagle_config.eagle_aux_hidden_state_layer_ids; "
                        "':legacy' applies model_patches/sglang_embed_tap.py first (process-wide, so every later "
                        "case must be ':legacy' too). "
                        "Repeatable; the FIRST case's draft is the one ModelRunner itself is started with.")
    p.add_argument("--input-ids", required=True, help="comma-separated token ids of the prefill")
    p.add_argument("--mm", default=None, metavar="FILE.pt",
                   help="(Kimi) one image for the prefill: torch file {pixel_values, grid_thws, image_token_id}; "
                        "--input-ids must hold image_token_id once per merged image token, contiguously")
    p.add_argument("--load-format", default="auto",
                   help="SGLang load format; 'auto' (real weights, what the parity tests use) or 'dummy' (debugging)")
    p.add_argument("--dump-params", action="store_true",
                   help="print the SGLang model's parameter names and shapes after loading, then exit")
    p.add_argument("--out", required=True, help="where to torch.save the captured taps and metadata")
    return p.parse_args(argv)


def _parse_case(text: str) -> tuple[str, Path, bool]:
    name, _, rest = text.partition("=")
    legacy = rest.endswith(":legacy")
    draft = Path(rest[: -len(":legacy")] if legacy else rest).resolve()
    if not name or not (draft / "config.json").is_file():
        raise SystemExit(f"--case {text!r}: expected NAME=DRAFT_DIR[:legacy] with DRAFT_DIR/config.json present")
    return name, draft, legacy


def _config_overrides(target: Path) -> dict:
    """``json_model_override_args`` for SGLang: only keys the checkpoint lacks and SGLang needs (see constants).

    SGLang merges overrides at the top level, so a nested ``text_config`` / ``vision_config`` is given whole.
    """
    cfg = json.loads((target / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    over = {k: v for k, v in TEXT_DEFAULTS.items() if k not in text}
    over.update(_rope_override(text))
    if "text_config" not in cfg:
        return over
    over.update({k: v for k, v in NESTED_TEXT_DEFAULTS.items() if not text.get(k)})
    result = {"text_config": {**text, **over}} if over else {}
    vision = cfg.get("vision_config")
    if vision is not None:
        vt = {k: vision[src] for k, src in VISION_ALIASES.items() if k not in vision and src in vision}
        if "text_hidden_size" not in vision:
            vt["text_hidden_size"] = int(text["hidden_size"])
        if vt:
            result["vision_config"] = {**vision, **vt}
    return result


def _rope_override(text: dict) -> dict:
    scaling = text.get("rope_scaling") or {}
    params = text.get("rope_parameters") or {}
    if scaling.get("rope_type", scaling.get("type")) in ("yarn", "deepseek_yarn") or \
            params.get("rope_type") in ("yarn", "deepseek_yarn"):
        return {}
    yarn = dict(YARN_IDENTITY, original_max_position_embeddings=int(text.get("max_position_embeddings", 4096)))
    if "rope_parameters" in text:
        yarn["rope_theta"] = params.get("rope_theta", text.get("rope_theta", 10000.0))
        return {"rope_parameters": yarn, "rope_scaling": yarn}
    return {"rope_scaling": yarn}


def _image_inputs(model, ids, mm_spec: dict):
    """One image as SGLang's scheduler hands it to the model: a ``MultimodalDataItem`` + padded ids.

    The pixel values are given (computed by transformers' Kimi K2.5 image processor in the test, so both engines see
    the same patches); the rest is SGLang's own: the item's hash-derived ``pad_value`` (``set_pad_value``) and the
    model's ``pad_input_ids`` (the scheduler's ``pad_input_ids_func``), which replace the placeholder tokens by the
    pad value that ``general_mm_embed_routine`` later finds and fills with the vision features.
    """
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    token = int(mm_spec["image_token_id"])
    positions = [i for i, t in enumerate(ids) if t == token]
    if not positions or positions != list(range(positions[0], positions[-1] + 1)):
        raise SystemExit(f"--mm: the input ids must hold image token {token} contiguously, got positions {positions}")
    item = MultimodalDataItem(modality=Modality.IMAGE, feature=mm_spec["pixel_values"],
                              offsets=[(positions[0], positions[-1])],
                              model_specific_data={"grid_thws": mm_spec["grid_thws"]})
    item.set_pad_value()
    mm_inputs = MultimodalInputs(mm_items=[item], im_token_id=token)
    return model.pad_input_ids(ids, mm_inputs), mm_inputs


def init_sglang_process(server_args):
    """What SGLang's scheduler process does before it builds model workers (``sglang.benchmark.one_batch`` does
    the same): env and torch config, ports, the published runtime context, process-global configs, the parallel
    and layer runtimes. Returns ``(port_args, model_config)`` of the target."""
    from sglang.benchmark.one_batch import _init_process_global_configs
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.runtime_context import SpawnRanks, get_device, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs

    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=0))
    _init_process_global_configs()

    model_config = ModelConfig.from_server_args(server_args)
    bootstrap.init_parallel_runtime(server_args=server_args, device=get_device().device,
                                    dist_port=port_args.nccl_port)
    bootstrap.init_layer_runtime(model_config=model_config)
    return port_args, model_config


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = [_parse_case(c) for c in args.case]
    for (name, _, legacy), (later, _, later_legacy) in zip(cases, cases[1:]):
        if legacy and not later_legacy:
            raise SystemExit(f"--case {later}: unpatched cases must come before legacy ones (after {name}); "
                             "the SGLang patch is process-wide and has no revert")
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))
    import shims

    shims.install()

    import torch

    target = Path(args.target).resolve()
    input_ids = [int(x) for x in args.input_ids.split(",") if x.strip()]
    sys.path.insert(0, str(REPO))
    from model_patches import sglang_embed_tap

    import sglang
    from array import array

    from sglang.benchmark.one_batch import TreeCacheNamespace
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )
    from sglang.srt.runtime_context import get_schedule
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    shims.route_torch_native_to_mla()
    overrides = _config_overrides(target)
    first_name, first_draft, first_legacy = cases[0]
    if first_legacy:
        sglang_embed_tap.apply()
    server_args = ServerArgs(
        model_path=str(target),
        tokenizer_path=str(target),
        device="cpu",
        dtype="float32",
        attention_backend="torch_native",
        load_format=args.load_format,  # "auto": the checkpoint's real weights
        json_model_override_args=json.dumps(overrides),
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(first_draft),
        disable_cuda_graph=True,
        mem_fraction_static=MEM_FRACTION,
        max_total_tokens=4096,
        max_running_requests=16,
        skip_server_warmup=True,
        random_seed=0,
    )
    declare_resolution(server_args, "vllm_eagle3.parity", cuda_graph_config={})
    server_args.resolve_once()
    port_args, model_config = init_sglang_process(server_args)
    runner = ModelRunner(model_config=model_config, mem_fraction_static=MEM_FRACTION, gpu_id=0,
                         nccl_port=port_args.nccl_port, server_args=server_args)
    runner.alloc_memory_pool()
    # -> configure_aux_hidden_state_capture -> model.set_eagle3_layers_to_capture(ids of the first case's draft)
    runner.init_attention_backends()
    runner.init_cuda_graphs()  # disable_cuda_graph: only sets up the (absent) graph runners, as one_batch does

    model = runner.model
    if args.dump_params:
        for pname, param in model.named_parameters():
            print(pname, tuple(param.shape))
        return 0
    text_lm = getattr(model, "language_model", model)
    decoder = text_lm.model
    result: dict = {
        "sglang_version": sglang.__version__,
        "model_class": type(model).__name__,
        "text_class": type(text_lm).__name__,
        "num_layers": int(text_lm.config.num_hidden_layers),
        "hidden_size": int(text_lm.config.hidden_size),
        "input_ids": input_ids,
        "config_overrides": overrides,
        "cases": {},
    }

    seen: dict = {}

    def hook(module, inputs, output):
        if isinstance(output, tuple):
            seen["aux"] = output[1].detach().to(torch.float32).clone()

    def embed_hook(module, inputs, output):
        seen.setdefault("embed", output.detach().to(torch.float32).clone())

    def input_embeds_hook(module, args_, kwargs):
        # DeepseekV2Model.forward(input_ids, positions, forward_batch, input_embeds, ...): Kimi hands the merged
        # multimodal embeddings here; a text-only DeepSeek passes None and embeds the ids itself.
        given = kwargs.get("input_embeds", args_[3] if len(args_) > 3 else None)
        if given is not None:
            seen["embed"] = given.detach().to(torch.float32).clone()

    decoder.register_forward_hook(hook)
    decoder.register_forward_pre_hook(input_embeds_hook, with_kwargs=True)
    decoder.embed_tokens.register_forward_hook(embed_hook)
    mm_spec = torch.load(args.mm, weights_only=False) if args.mm else None
    if mm_spec is not None:
        # What the scheduler's build_kv_cache does (mem_cache/kv_cache_builder.py): the vision-embedding cache.
        from sglang.srt.environ import envs
        from sglang.srt.managers.mm_schedule import init_mm_embedding_cache

        init_mm_embedding_cache(envs.SGLANG_VLM_CACHE_SIZE_MB.get() * 1024 * 1024)

    for index, (name, draft, legacy) in enumerate(cases):
        case: dict = {"draft": str(draft), "legacy_patch": None, "error": None, "aux": None}
        seen.clear()
        if index == 0:
            ids = runner.spec_aux_config.eagle_aux_hidden_state_layer_ids
            case["ids_source"] = "ModelRunner(speculative_draft_model_path=draft) -> init_attention_backends"
        else:
            if legacy:
                sglang_embed_tap.apply()
            # What spec_aux_hidden_state.py does for the runner's draft, for this case's draft.
            draft_cfg = ModelConfig.from_server_args(server_args, model_path=str(draft), is_draft_model=True)
            ids = draft_cfg.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]
            case["ids_source"] = "draft ModelConfig eagle_config -> configure_aux_hidden_state_capture"
            try:
                configure_aux_hidden_state_capture(
                    model=model, eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=ids,
                    dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None, is_dspark=False)
            except Exception as exc:
                case["error"] = f"{type(exc).__name__}: {exc}"
        case["legacy_patch"] = (dict(sglang_embed_tap.APPLIED.get(sglang_embed_tap.PATCH_NAME) or {}) or None) \
            if legacy else None
        case["draft_ids"] = list(ids or [])
        case["layers_to_capture"] = list(decoder.layers_to_capture)

        if case["error"] is None:
            ids_array, mm_inputs = array("q", input_ids), None
            if mm_spec is not None:
                ids_array, mm_inputs = _image_inputs(model, ids_array, mm_spec)
                case["padded_input_ids"] = list(ids_array)
            req = Req(rid=index, origin_input_text="", origin_input_ids=ids_array,
                      sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
            req.multimodal_inputs = mm_inputs
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1
            req.extend_end = len(req.origin_input_ids)
            tree_cache = TreeCacheNamespace(page_size=get_schedule().page_size, device=runner.device,
                                            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)
            batch = ScheduleBatch.init_new(reqs=[req], req_to_token_pool=runner.req_to_token_pool,
                                           token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                                           tree_cache=tree_cache, model_config=runner.model_config,
                                           enable_overlap=False, spec_algorithm=SpeculativeAlgorithm.NONE)
            batch.prepare_for_extend()
            if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
                batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
                batch.prefill_input_ids_cpu = None
            forward_batch = ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)
            shims.reset_calls()
            try:
                with torch.no_grad():
                    runner.forward(forward_batch)
            except Exception as exc:  # SGLang refusing the ids is a result the test asserts on
                case["error"] = f"{type(exc).__name__}: {exc}"
                case["traceback"] = traceback.format_exc()
            case["stub_calls"] = list(shims.CALLS)
            shims.assert_no_stub_called(f"the SGLang target prefill of case {name!r}")
        case["aux"] = seen.get("aux")
        case["embed"] = seen.get("embed")
        result["cases"][name] = case
        print(json.dumps({"case": name, **{k: v for k, v in case.items()
                                           if k not in ("aux", "embed", "traceback")}}), flush=True)

    torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
