"""Run SGLang 0.5.23's own EAGLE-3 draft (``LlamaForCausalLMEagle3``) for one draft-extend forward; save its logits.

Executed with ``.venv-sglang/bin/python`` (SGLang's isolated venv, see ``scripts/setup_sglang_env.sh``), never
imported by the main test venv. It is the draft-side twin of ``runner.py``: the test feeds vLLM's
``llama_eagle3.py`` the identical input and compares the logits.

How SGLang is driven (what ``Scheduler.init_model_worker`` does, minus the server):

1. ``ServerArgs(model_path=TARGET, speculative_algorithm="EAGLE3", speculative_draft_model_path=DRAFT, ...)`` on CPU,
   ``attention_backend="torch_native"``, float32 (the same settings and target-config overrides as ``runner.py``).
   The draft worker gets an otherwise identical ``ServerArgs`` WITHOUT ``json_model_override_args``: SGLang applies
   that option to the draft's config as well, and runner.py's Kimi override (a whole nested ``text_config``) would
   turn the Llama draft's ``ModelConfig`` into the target's text model (see ``make_server_args`` in ``main``).
2. The target ``TpModelWorker`` (only loaded, never run: the draft needs its KV pools and its input embedding),
   then ``SpeculativeAlgorithm.create_worker`` -> ``EAGLEWorkerV2``, whose ``EagleDraftWorker`` builds the draft
   ``TpModelWorker(is_draft_worker=True)`` -> ``ModelConfig.from_server_args(..., is_draft_model=True)`` ->
   ``ModelRunner(is_draft_worker=True)`` -> ``LlamaForCausalLMEagle3.load_weights`` (``d2t`` -> ``hot_token_id``).
   Attention: the draft runner's own ``torch_native`` backend (``TorchNativeAttnBackend``, as for the target). The
   multi-step draft-decode backends ``EagleDraftWorker.init_attention_backend`` adds are not built: SGLang's
   ``DraftBackendFactory`` has no ``torch_native`` entry, and the draft extend does not use them.
3. Pools as the scheduler shares them: the target allocates, the draft gets the target's ``req_to_token_pool`` and
   allocator (its own KV pool) -> ``EagleDraftWorker.init_lm_head``: EAGLE-3 keeps its own ``lm_head`` and takes the
   TARGET's input embedding via ``set_embed`` (``resolve_draft_embed_and_head``).
4. One prefill batch (``Req`` -> ``ScheduleBatch.prepare_for_extend``), then SGLang's own
   ``EagleDraftWorker._draft_extend_for_prefill(batch, target_hidden_states=aux, next_token_ids)``: it rotates the
   batch ids left by one and appends the next token (so the draft reads exactly ``--inputs``' ``input_ids``; the
   batch is built as ``[placeholder] + input_ids[:-1]`` with ``next_token_ids = input_ids[-1:]``, and the ids the
   draft really read are saved and checked), sets ``spec_info = EagleDraftExtendInput(hidden_states=aux)``,
   ``capture_hidden_mode=LAST``, and calls ``ModelRunner.forward``. ``LlamaModel.forward`` reads
   ``spec_info.hidden_states`` and applies ``fc`` (the aux width differs from the embedding width).

Observation only: SGLang's ``LogitsProcessor`` keeps only the last position of an extend, so a forward hook on the
draft's ``LlamaModel`` copies its post-norm output (what SGLang hands ``lm_head``) at every position, and
``logits = hidden @ lm_head.weight.T`` with SGLang's loaded ``lm_head`` weight (row by row, so the last row is
bit-identical to SGLang's). A hook on the logits processor keeps SGLang's own last-position logits so the test can
check both agree. Nothing of the draft's forward is re-implemented.

Shims: ``shims.install()`` (stub ``sgl_kernel`` recorded and asserted unused during the forward; torchvision nms
schemas), plus :func:`_kv_pool_warmup_self_copy`, scoped to the draft's KV-pool construction only (the pool's
warm-up copies slot 0 onto itself through an ``sgl_kernel`` op; only such identity copies are accepted).
``shims.route_torch_native_to_mla()`` is NOT called: it only registers an entry in DeepSeek's
``AttentionBackendRegistry`` (consulted by ``deepseek_v2.py`` / ``sarvam_moe.py`` attention, never by Llama's), and
the target model is never run here.

Output (``torch.save``): ``logits`` [T, draft_vocab] float32, ``hidden_post_norm`` [T, H], ``hidden_pre_norm_aux``
[T, H] (the draft's aux output, what SGLang would feed the next draft step), ``embed`` [T, H] (the target embedding
rows the draft used), ``draft_input_ids`` / ``draft_positions`` (what the draft's ``LlamaModel`` actually read),
``last_token_logits_sglang`` [1, draft_vocab], ``last_hidden_sglang`` (LAST capture), ``topk_p`` / ``topk_index``
(SGLang's next draft input, draft-vocab ids), ``hot_token_id`` [draft_vocab] (draft id -> target id) and ``d2t``
(``hot_token_id - arange``), ``sglang_version``, ``model_class``, ``draft_config``, ``stub_calls``, ``error``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Placeholder first id of the TARGET prefill batch: ``_draft_extend_for_prefill`` drops the batch's first id when it
#: rotates the ids left, so its value never reaches the draft (checked: ``draft_input_ids == input_ids``).
PLACEHOLDER_ID = 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--draft", required=True, help="EAGLE-3 draft checkpoint folder (LlamaForCausalLMEagle3)")
    p.add_argument(
        "--target",
        required=True,
        help="target checkpoint folder whose input embedding the draft shares (DeepseekV3 or KimiK25)",
    )
    p.add_argument(
        "--inputs",
        required=True,
        help="torch file {input_ids [T] long (the ids the draft reads, already shifted by one), "
        "positions [T] long (must be 0..T-1: SGLang derives them from the batch), "
        "aux [T, K*H] float32 (the target's concatenated taps, before the draft's fc)}",
    )
    p.add_argument("--load-format", default="auto", help="SGLang load format ('auto': the real weights)")
    p.add_argument("--out", required=True, help="where to torch.save the logits and metadata")
    return p.parse_args(argv)


def _load_inputs(path: str):
    import torch

    spec = torch.load(path, weights_only=False)
    ids = torch.as_tensor(spec["input_ids"]).long().reshape(-1)
    t = ids.numel()
    positions = torch.as_tensor(spec.get("positions", torch.arange(t))).long().reshape(-1)
    aux = torch.as_tensor(spec["aux"]).to(torch.float32)
    if t < 1 or aux.dim() != 2 or aux.shape[0] != t:
        raise SystemExit(f"--inputs: input_ids [{t}] and aux {tuple(aux.shape)} must agree on T >= 1")
    if not torch.equal(positions, torch.arange(t)):
        raise SystemExit("--inputs: positions must be 0..T-1 (a single prefill; SGLang computes them itself)")
    return ids, positions, aux.contiguous()


@contextlib.contextmanager
def _draft_contexts(draft_worker, pp: bool = True):
    """The contexts EagleDraftWorker enters around its draft runner (init: with ``draft_pp_context``; forward: not)."""
    from sglang.srt.layers.moe.utils import speculative_moe_a2a_backend_context, speculative_moe_backend_context
    from sglang.srt.speculative.spec_utils import draft_pp_context, draft_tp_context

    with contextlib.ExitStack() as stack:
        if pp:
            stack.enter_context(draft_pp_context())
        stack.enter_context(draft_tp_context(draft_worker.parallel_layout))
        stack.enter_context(speculative_moe_backend_context())
        stack.enter_context(speculative_moe_a2a_backend_context())
        yield


@contextlib.contextmanager
def _kv_pool_warmup_self_copy():
    """Shim 4, scoped to the draft's KV-pool construction: the pool's warm-up self-copy of slot 0.

    With a speculative algorithm set, SGLang builds the draft's MHA KV pool with ``enable_kv_cache_copy=True``
    (``kv_cache_configurator.py``), and ``MHATokenToKVPool._init_kv_copy_and_warmup`` then warms the copy kernel up
    once: ``copy_all_layer_kv_cache_func(ptrs, strides, dummy_loc, dummy_loc, 1, ...)`` with ``dummy_loc`` all zeros,
    i.e. copies slot 0 of every layer onto itself. On CPU that is ``sgl_kernel.copy_all_layer_kv_cache_cpu``, which
    the stub ``sgl_kernel`` only records and refuses (the target's MLA pool has no such warm-up). A copy whose source
    and target slots are the same changes no byte, so during the pool construction only, the stub is replaced by a
    function that ACCEPTS ONLY such self-copies (anything else still raises) and does nothing. The recording stub is
    put back before the forward, so a KV move during the compared forward would still fail the run.
    """
    from sglang.kernels.ops.kvcache import cache_move

    calls: list[dict] = []
    stub = cache_move.copy_all_layer_kv_cache_cpu

    def self_copy_only(data_ptrs, strides, tgt_loc, src_loc):
        if not (tgt_loc.shape == src_loc.shape and bool((tgt_loc == src_loc).all())):
            return stub(data_ptrs, strides, tgt_loc, src_loc)  # a real move: record + raise, as everywhere else
        calls.append({"layers_buffers": int(data_ptrs.numel()), "slots": sorted(set(tgt_loc.tolist()))})

    cache_move.copy_all_layer_kv_cache_cpu = self_copy_only
    try:
        yield calls
    finally:
        cache_move.copy_all_layer_kv_cache_cpu = stub


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))
    import shims

    shims.install()

    import torch

    import runner as target_harness  # the target-side harness: same config overrides, same memory settings

    draft = Path(args.draft).resolve()
    target = Path(args.target).resolve()
    for folder in (draft, target):
        if not (folder / "config.json").is_file():
            raise SystemExit(f"{folder}: no config.json")
    input_ids, positions, aux = _load_inputs(args.inputs)
    t = input_ids.numel()

    import sglang
    from array import array

    from sglang.benchmark.one_batch import TreeCacheNamespace
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_schedule
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    overrides = target_harness._config_overrides(target)

    def make_server_args(override_args: dict) -> "ServerArgs":
        sa = ServerArgs(
            model_path=str(target),
            tokenizer_path=str(target),
            skip_tokenizer_init=True,  # the harness feeds token ids; also spares loading Kimi's multimodal processor
            device="cpu",
            dtype="float32",
            attention_backend="torch_native",
            load_format=args.load_format,
            json_model_override_args=json.dumps(override_args),
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=str(draft),
            disable_cuda_graph=True,
            mem_fraction_static=target_harness.MEM_FRACTION,
            max_total_tokens=4096,
            max_running_requests=16,
            skip_server_warmup=True,
            random_seed=0,
        )
        declare_resolution(sa, "vllm_eagle3.parity", cuda_graph_config={})
        sa.resolve_once()
        return sa

    # The process's (published) config, which the target is built from: with runner.py's target-config overrides.
    server_args = make_server_args(overrides)
    # The config the draft worker is built from: the same, WITHOUT json_model_override_args. SGLang applies
    # json_model_override_args to the draft's config too (ModelConfig.from_server_args(..., is_draft_model=True));
    # the overrides are fixes of the TARGET checkpoint's config (runner.py), and for a Kimi target they hold a whole
    # nested ``text_config``, which would turn the Llama draft's ModelConfig into the target's text model (its KV pool
    # came out 61 layers x 2 heads x 64 instead of 1 x 4 x 32; the forward then fails writing the KV cache).
    draft_server_args = make_server_args({}) if overrides else server_args
    port_args, _ = target_harness.init_sglang_process(server_args)

    # Scheduler.init_model_worker: target worker, then the speculative worker that builds the draft.
    target_worker = TpModelWorker(server_args=server_args, gpu_id=0, nccl_port=port_args.nccl_port)
    spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE3")
    spec_worker_cls = spec_algorithm.create_worker(server_args)
    spec_worker = spec_worker_cls(
        server_args=draft_server_args, gpu_id=0, nccl_port=port_args.nccl_port, target_worker=target_worker
    )
    draft_worker = spec_worker._draft_worker  # EagleDraftWorker
    # Scheduler.init_memory_pools: the target allocates, the draft shares its req->token pool and allocator.
    target_worker.model_runner.account_preloaded_weights(
        target_worker.preloaded_weights_bytes + spec_worker.preloaded_weights_bytes
    )
    target_worker.alloc_memory_pool(draft_parallel_layout=spec_worker.draft_parallel_layout)
    pool, allocator = target_worker.get_memory_pool()
    with _kv_pool_warmup_self_copy() as warmup_calls:
        spec_worker.alloc_memory_pool(
            memory_pool_config=target_worker.model_runner.memory_pool_config,
            req_to_token_pool=pool,
            token_to_kv_pool_allocator=allocator,
        )
    # Scheduler.init_all_attention_backends / init_all_cuda_graphs (disable_cuda_graph: no graphs are captured), with
    # EagleDraftWorker's contexts. Of EagleDraftWorker.init_attention_backends only the draft runner's own backend
    # (torch_native, as for the target) is built: its second half, init_attention_backend, makes the multi-step
    # draft-DECODE backends and a draft-extend override, and DraftBackendFactory has no torch_native entry ("EAGLE is
    # not supported in decode attention backend torch_native"; on CPU SGLang serves EAGLE through intel_amx, a
    # sgl_kernel backend). The draft extend below runs on draft_runner.attn_backend either way.
    target_worker.init_attention_backends()
    target_worker.init_cuda_graphs()
    with _draft_contexts(draft_worker):
        draft_worker.draft_worker.init_attention_backends()
        draft_worker.draft_worker.init_cuda_graphs(capture_decode_cuda_graph=False)

    draft_runner = draft_worker.draft_runner
    model = draft_runner.model
    decoder = model.model  # sglang.srt.models.llama_eagle3.LlamaModel
    hot = model.get_hot_token_id() if hasattr(model, "get_hot_token_id") else None
    result: dict = {
        "sglang_version": sglang.__version__,
        "model_class": type(model).__name__,
        "model_module": type(model).__module__,
        "spec_worker_class": type(spec_worker).__name__,
        "draft_worker_class": type(draft_worker).__name__,
        "draft_is_draft_worker": bool(draft_runner.is_draft_worker),
        "attention_backend": type(draft_runner.attn_backend).__name__,
        "draft_config": draft_runner.model_config.hf_config.to_dict(),
        "target_model_class": type(target_worker.model_runner.model).__name__,
        "config_overrides": overrides,
        "input_ids": input_ids.clone(),
        "hot_token_id": None if hot is None else hot.detach().cpu().long().clone(),
        "d2t": None if hot is None else (hot.detach().cpu().long() - torch.arange(hot.shape[0])),
        "embed_shared_with_target": (
            decoder.embed_tokens.weight.data_ptr()
            == target_worker.model_runner.model.get_embed_and_head()[0].data_ptr()
        ),
        "kv_pool_warmup_self_copies": warmup_calls,
        "error": None,
    }

    seen: dict = {}

    def model_pre_hook(module, args_, kwargs):
        ids = kwargs.get("input_ids", args_[0] if args_ else None)
        pos = kwargs.get("positions", args_[1] if len(args_) > 1 else None)
        seen["input_ids"] = ids.detach().cpu().clone()
        seen["positions"] = pos.detach().cpu().clone()

    def model_hook(module, inputs, output):
        to_logits, aux_out = output
        seen["hidden_post_norm"] = to_logits.detach().to(torch.float32).cpu().clone()
        seen["hidden_pre_norm_aux"] = aux_out[0].detach().to(torch.float32).cpu().clone()

    def embed_hook(module, inputs, output):
        seen.setdefault("embed", output.detach().to(torch.float32).cpu().clone())

    def logits_hook(module, inputs, output):
        seen["last_token_logits_sglang"] = output.next_token_logits.detach().to(torch.float32).cpu().clone()
        if output.hidden_states is not None:
            seen["last_hidden_sglang"] = output.hidden_states.detach().to(torch.float32).cpu().clone()

    decoder.register_forward_pre_hook(model_pre_hook, with_kwargs=True)
    decoder.register_forward_hook(model_hook)
    decoder.embed_tokens.register_forward_hook(embed_hook)
    model.logits_processor.register_forward_hook(logits_hook)

    # The target prefill batch the draft extend follows: ids [placeholder, s_0 .. s_{T-2}], next token s_{T-1}.
    batch_ids = array("q", [PLACEHOLDER_ID] + input_ids[:-1].tolist())
    req = Req(
        rid=0,
        origin_input_text="",
        origin_input_ids=batch_ids,
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
    )
    req.full_untruncated_fill_ids = req.origin_input_ids
    req.logprob_start_len = -1
    req.extend_end = len(req.origin_input_ids)
    tree_cache = TreeCacheNamespace(
        page_size=get_schedule().page_size, device=draft_runner.device, token_to_kv_pool_allocator=allocator
    )
    batch = ScheduleBatch.init_new(
        reqs=[req],
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        tree_cache=tree_cache,
        model_config=target_worker.model_runner.model_config,
        enable_overlap=False,
        spec_algorithm=spec_algorithm,
    )
    batch.prepare_for_extend()
    if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
        batch.prefill_input_ids_cpu = None
    next_token_ids = input_ids[-1:].to(batch.device)

    shims.reset_calls()
    draft_input = None
    try:
        # EAGLEWorkerV2._forward_prefill_batch's draft half, with the aux taps as the target hidden states.
        with _draft_contexts(draft_worker, pp=False), torch.no_grad():
            draft_input = draft_worker._draft_extend_for_prefill(batch, aux.to(batch.device), next_token_ids)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    result["stub_calls"] = list(shims.CALLS)
    shims.assert_no_stub_called("the SGLang EAGLE-3 draft extend")

    hidden = seen.get("hidden_post_norm")
    result["hidden_post_norm"] = hidden
    result["hidden_pre_norm_aux"] = seen.get("hidden_pre_norm_aux")
    result["embed"] = seen.get("embed")
    result["draft_input_ids"] = seen.get("input_ids")
    result["draft_positions"] = seen.get("positions")
    result["last_token_logits_sglang"] = seen.get("last_token_logits_sglang")
    result["last_hidden_sglang"] = seen.get("last_hidden_sglang")
    result["logits"] = None
    if hidden is not None:
        head = model.lm_head.weight.detach().to(torch.float32).cpu()
        result["lm_head_shape"] = list(head.shape)
        # Row by row: the [1, H] @ [H, V] product SGLang's LogitsProcessor computes for the pruned last row, so the
        # last row is bit-identical to SGLang's own (one [T, H] matmul differs from it by float32 rounding, ~3e-6).
        result["logits"] = torch.cat([hidden[i : i + 1] @ head.T for i in range(hidden.shape[0])])
    if draft_input is not None:
        result["topk_p"] = draft_input.topk_p.detach().cpu().clone()
        result["topk_index"] = draft_input.topk_index.detach().cpu().clone()
    if result["error"] is None:
        if result["draft_input_ids"] is None or not torch.equal(result["draft_input_ids"].long(), input_ids):
            result["error"] = (
                f"the draft read ids {result['draft_input_ids']}, not the given {input_ids} "
                "(SGLang's prefill rotation changed?)"
            )
        elif not torch.equal(result["draft_positions"].long(), positions):
            result["error"] = f"the draft read positions {result['draft_positions']}, not 0..{t - 1}"
        elif result["logits"] is None or result["logits"].shape[0] != t:
            result["error"] = f"hook saw no [T={t}] post-norm hidden state"

    summary = {
        k: (list(v.shape) if isinstance(v, torch.Tensor) else v)
        for k, v in result.items()
        if k not in ("draft_config", "traceback", "config_overrides")
    }
    last = result["last_token_logits_sglang"]
    if result["logits"] is not None and last is not None:
        summary["last_position_max_abs_diff"] = (result["logits"][-1:] - last).abs().max().item()
    print(json.dumps(summary, default=str), flush=True)
    torch.save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
