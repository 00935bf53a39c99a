"""Run SGLang's own DeepseekV2/V3 or KimiK25 model on a checkpoint and save the EAGLE-3 taps it captures.

Two SGLang releases, each in its own venv (``scripts/setup_sglang_env.sh``), never imported by the main test venv:
``.venv-sglang`` (0.5.23, the current capture rule) and ``.venv-sglang-legacy`` (0.5.12.post1, the newest release
with the legacy ``[val + 1 for val in layer_ids]`` rule). The version-specific set-up (process init, ids -> capture,
the prefill batch) is in :func:`build_runner`, :func:`set_capture` and :func:`prefill_batch`; everything else is shared.
Data flow observed: target forward -> SGLang's aux capture
(``DeepseekV2Model.layers_to_capture``) -> the packed ``[tokens, K * hidden]`` aux tensor the model hands its
logits processor (which SGLang then feeds to the draft's ``fc``).

How the capture ids are set: the way SGLang's scheduler does it. ``ServerArgs(speculative_algorithm="EAGLE3",
speculative_draft_model_path=DRAFT)`` makes ``ModelRunner`` read the draft's ``config.json``
(``spec_aux_hidden_state.py`` takes ``eagle_config.eagle_aux_hidden_state_layer_ids``) and call the model's own
``set_eagle3_layers_to_capture`` in ``init_attention_backends``. The prefill is built like SGLang's
``benchmark/one_batch.py`` (``Req`` -> ``ScheduleBatch.prepare_for_extend`` -> ``ForwardBatch`` ->
``ModelRunner.forward``). A forward hook on the decoder stack (``DeepseekV2Model``) copies its
``(hidden, aux)`` output: observation only, the forward is SGLang's.

On 0.5.12.post1 the model runner is built the way its ``bench_one_batch.load_model`` does (``ModelRunner.__init__``
itself reads the draft config and calls ``set_eagle3_layers_to_capture`` in ``init_aux_hidden_state_capture``); the
decoder stack returns the aux states as a list, which the logits processor concatenates in list order
(``layers/logits_processor.py`` ``torch.cat(aux_hidden_states, dim=-1)``): the runner does the same.

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
YARN_IDENTITY = {
    "rope_type": "yarn",
    "type": "yarn",
    "factor": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


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
VISION_ALIASES = {
    "vt_hidden_size": "hidden_size",
    "init_pos_emb_height": "pos_emb_height",
    "init_pos_emb_width": "pos_emb_width",
    "init_pos_emb_time": "pos_emb_time",
}

#: SGLang sizes its KV pool from the memory left after loading weights, as a fraction of what was free before
#: (on CPU: system memory, which other processes on a shared machine change during the load). A large fraction
#: only makes the check robust; ``max_total_tokens`` caps the pool actually allocated at a few MB.
MEM_FRACTION = 0.5


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", required=True, help="checkpoint folder (DeepseekV3ForCausalLM or KimiK25)")
    p.add_argument(
        "--case",
        action="append",
        required=True,
        metavar="NAME=DRAFT_DIR[:legacy]",
        help="one capture case: SGLang reads DRAFT_DIR's eagle_config.eagle_aux_hidden_state_layer_ids; "
        "':legacy' applies vllm_eagle3/model_patches/sglang_embed_tap.py first "
        "(process-wide, so every later case must be ':legacy' too). "
        "Repeatable; the FIRST case's draft is the one ModelRunner itself is started with.",
    )
    p.add_argument("--input-ids", required=True, help="comma-separated token ids of the prefill")
    p.add_argument(
        "--mm",
        default=None,
        metavar="FILE.pt",
        help="(Kimi) one image for the prefill: torch file {pixel_values, grid_thws, image_token_id}; "
        "--input-ids must hold image_token_id once per merged image token, contiguously",
    )
    p.add_argument(
        "--load-format",
        default="auto",
        help="SGLang load format; 'auto' (real weights, what the parity tests use) or 'dummy' (debugging)",
    )
    p.add_argument(
        "--dump-params",
        action="store_true",
        help="print the SGLang model's parameter names and shapes after loading, then exit",
    )
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
    if scaling.get("rope_type", scaling.get("type")) in ("yarn", "deepseek_yarn") or params.get("rope_type") in (
        "yarn",
        "deepseek_yarn",
    ):
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
    item = MultimodalDataItem(
        modality=Modality.IMAGE,
        feature=mm_spec["pixel_values"],
        offsets=[(positions[0], positions[-1])],
        model_specific_data={"grid_thws": mm_spec["grid_thws"]},
    )
    item.set_pad_value()
    mm_inputs = MultimodalInputs(mm_items=[item], im_token_id=token)
    return model.pad_input_ids(ids, mm_inputs), mm_inputs


def legacy_target(target: Path, overrides: dict, workdir: Path) -> tuple[Path, dict]:
    """``(model folder, json_model_override_args)`` for SGLang 0.5.12.post1.

    0.5.23 merges ``json_model_override_args`` into nested sub-configs. 0.5.12.post1's ``get_config`` does a plain
    ``config.update(overrides)``, which replaces a nested ``text_config`` / ``vision_config`` object by a dict (its
    ``adjust_config_with_unaligned_cpu_tp`` then fails on ``dict.model_type``). So for a nested config the same
    merged config is written to ``workdir/sglang_legacy_target/config.json`` next to symlinks to every other file of
    the checkpoint (same weights), and no overrides are passed.
    """
    cfg = json.loads((target / "config.json").read_text())
    if "text_config" not in cfg or not overrides:
        return target, overrides
    for key, value in overrides.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    folder = workdir / "sglang_legacy_target"
    folder.mkdir(parents=True, exist_ok=True)
    for item in target.iterdir():
        link = folder / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item.resolve())
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder, {}


def is_legacy(version: str) -> bool:
    """Whether this SGLang release falls under the engine table's ``sglang-legacy`` version rule (before 0.5.13:
    the always-+1 id rule, and ``ModelRunner.__init__`` does the whole set-up, 0.5.12.post1's layout). Needs the
    repository on ``sys.path``; :mod:`vllm_eagle3.engines` is standard library only."""
    from vllm_eagle3.engines import engine_for_version

    return engine_for_version("sglang", version).name == "sglang-legacy"


def init_sglang_process(server_args):
    """What SGLang 0.5.23's scheduler process does before it builds model workers (``sglang.benchmark.one_batch``
    does the same): env and torch config, ports, the published runtime context, process-global configs, the
    parallel and layer runtimes. Returns ``(port_args, model_config)`` of the target."""
    from sglang.benchmark.one_batch import _init_process_global_configs
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.runtime_context import SpawnRanks, get_device, publish, spawn_world_rank
    from sglang.srt.server_args import PortArgs

    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)
    publish(
        server_args,
        role="scheduler",
        ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=0),
    )
    _init_process_global_configs()

    model_config = ModelConfig.from_server_args(server_args)
    bootstrap.init_parallel_runtime(server_args=server_args, device=get_device().device, dist_port=port_args.nccl_port)
    bootstrap.init_layer_runtime(model_config=model_config)
    return port_args, model_config


def build_runner(server_args, legacy: bool):
    """SGLang's ``ModelRunner`` for the target, set up as SGLang itself does; capture ids = the first case's draft.

    0.5.23: process init, then ``alloc_memory_pool`` and ``init_attention_backends`` (which calls
    ``configure_aux_hidden_state_capture`` -> ``set_eagle3_layers_to_capture``). 0.5.12.post1: what its
    ``bench_one_batch.load_model`` does; ``ModelRunner.__init__`` reads the draft's ``eagle_config`` and calls
    ``set_eagle3_layers_to_capture`` (``init_aux_hidden_state_capture``)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner

    if legacy:
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.server_args import PortArgs

        _set_envs_and_config(server_args)
        port_args = PortArgs.init_new(server_args)
        return ModelRunner(
            model_config=ModelConfig.from_server_args(server_args),
            mem_fraction_static=MEM_FRACTION,
            gpu_id=0,
            tp_rank=0,
            tp_size=1,
            moe_ep_rank=0,
            moe_ep_size=1,
            pp_rank=0,
            pp_size=1,
            nccl_port=port_args.nccl_port,
            server_args=server_args,
        )
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, "vllm_eagle3.parity", cuda_graph_config={})
    server_args.resolve_once()
    port_args, model_config = init_sglang_process(server_args)
    runner = ModelRunner(
        model_config=model_config,
        mem_fraction_static=MEM_FRACTION,
        gpu_id=0,
        nccl_port=port_args.nccl_port,
        server_args=server_args,
    )
    runner.alloc_memory_pool()
    # -> configure_aux_hidden_state_capture -> model.set_eagle3_layers_to_capture(ids of the first case's draft)
    runner.init_attention_backends()
    runner.init_cuda_graphs()  # disable_cuda_graph: only sets up the (absent) graph runners, as one_batch does
    return runner


def runner_capture_ids(runner, legacy: bool):
    """The ids SGLang's runner read from its draft's config."""
    if legacy:
        return runner.eagle_aux_hidden_state_layer_ids
    return runner.spec_aux_config.eagle_aux_hidden_state_layer_ids


def set_capture(model, ids, legacy: bool) -> None:
    """Capture ``ids`` on the built model, the way the version's runner does it for its own draft."""
    if legacy:
        model.set_eagle3_layers_to_capture(ids)  # ModelRunner.init_aux_hidden_state_capture, 0.5.12.post1
        return
    from sglang.srt.model_executor.model_runner_components.attention_backend_setup import (
        configure_aux_hidden_state_capture,
    )

    configure_aux_hidden_state_capture(
        model=model,
        eagle_use_aux_hidden_state=True,
        eagle_aux_hidden_state_layer_ids=ids,
        dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None,
        is_dspark=False,
    )


def prefill_batch(runner, rid: int, ids_array, mm_inputs, legacy: bool):
    """One greedy prefill request as a ``ForwardBatch``, built like the version's ``one_batch`` benchmark."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    params = SamplingParams(temperature=0, max_new_tokens=1)
    if legacy:
        from sglang.bench_one_batch import TreeCacheNamespace

        req = Req(rid=rid, origin_input_text="", origin_input_ids=list(ids_array), sampling_params=params)
        req.multimodal_inputs = mm_inputs
        req.fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))
        page_size = runner.server_args.page_size
    else:
        from sglang.benchmark.one_batch import TreeCacheNamespace
        from sglang.srt.runtime_context import get_schedule

        req = Req(rid=rid, origin_input_text="", origin_input_ids=ids_array, sampling_params=params)
        req.multimodal_inputs = mm_inputs
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.extend_end = len(req.origin_input_ids)
        page_size = get_schedule().page_size
    tree_cache = TreeCacheNamespace(
        page_size=page_size, device=runner.device, token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator
    )
    batch = ScheduleBatch.init_new(
        reqs=[req],
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        tree_cache=tree_cache,
        model_config=runner.model_config,
        enable_overlap=False,
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    batch.prepare_for_extend()
    if legacy:
        return ForwardBatch.init_new(batch.get_model_worker_batch(), runner)
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
        batch.prefill_input_ids_cpu = None
    return ForwardBatch.init_new(batch, runner, return_hidden_states_before_norm=False)


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = [_parse_case(c) for c in args.case]
    for (name, _, legacy), (later, _, later_legacy) in zip(cases, cases[1:]):
        if legacy and not later_legacy:
            raise SystemExit(
                f"--case {later}: unpatched cases must come before legacy ones (after {name}); "
                "the SGLang patch is process-wide and has no revert"
            )
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))
    import shims

    shims.install()

    import torch

    target = Path(args.target).resolve()
    input_ids = [int(x) for x in args.input_ids.split(",") if x.strip()]
    sys.path.insert(0, str(REPO))
    from vllm_eagle3.model_patches import sglang_embed_tap

    import sglang
    from array import array

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    legacy_sglang = is_legacy(sglang.__version__)
    shims.route_torch_native_to_mla()
    overrides = _config_overrides(target)
    first_name, first_draft, first_legacy = cases[0]
    if first_legacy:
        sglang_embed_tap.apply()
    model_dir, server_overrides = target, overrides
    if legacy_sglang:
        model_dir, server_overrides = legacy_target(target, overrides, Path(args.out).resolve().parent)
    server_args = ServerArgs(
        model_path=str(model_dir),
        tokenizer_path=str(model_dir),
        device="cpu",
        dtype="float32",
        attention_backend="torch_native",
        load_format=args.load_format,  # "auto": the checkpoint's real weights
        json_model_override_args=json.dumps(server_overrides),
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path=str(first_draft),
        disable_cuda_graph=True,
        mem_fraction_static=MEM_FRACTION,
        max_total_tokens=4096,
        max_running_requests=16,
        skip_server_warmup=True,
        random_seed=0,
    )
    runner = build_runner(server_args, legacy_sglang)

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
            aux = output[1]
            if isinstance(aux, (list, tuple)):  # 0.5.12.post1: a list, concatenated by its logits processor
                aux = torch.cat(aux, dim=-1)
            seen["aux"] = aux.detach().to(torch.float32).clone()

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
            ids = runner_capture_ids(runner, legacy_sglang)
            case["ids_source"] = "ModelRunner(speculative_draft_model_path=draft) -> " + (
                "__init__ -> init_aux_hidden_state_capture" if legacy_sglang else "init_attention_backends"
            )
        else:
            if legacy:
                sglang_embed_tap.apply()
            # What spec_aux_hidden_state.py does for the runner's draft, for this case's draft.
            draft_cfg = ModelConfig.from_server_args(server_args, model_path=str(draft), is_draft_model=True)
            ids = draft_cfg.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"]
            case["ids_source"] = "draft ModelConfig eagle_config -> " + (
                "set_eagle3_layers_to_capture" if legacy_sglang else "configure_aux_hidden_state_capture"
            )
            try:
                set_capture(model, ids, legacy_sglang)
            except Exception as exc:
                case["error"] = f"{type(exc).__name__}: {exc}"
        case["legacy_patch"] = (
            (dict(sglang_embed_tap.APPLIED.get(sglang_embed_tap.PATCH_NAME) or {}) or None) if legacy else None
        )
        case["draft_ids"] = list(ids or [])
        case["layers_to_capture"] = list(decoder.layers_to_capture)

        if case["error"] is None:
            ids_array, mm_inputs = array("q", input_ids), None
            if mm_spec is not None:
                ids_array, mm_inputs = _image_inputs(model, ids_array, mm_spec)
                case["padded_input_ids"] = list(ids_array)
            forward_batch = prefill_batch(runner, index, ids_array, mm_inputs, legacy_sglang)
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
        print(
            json.dumps({"case": name, **{k: v for k, v in case.items() if k not in ("aux", "embed", "traceback")}}),
            flush=True,
        )

    torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
