"""min_p and logit_bias under speculation (vllm_eagle3/model_patches/vllm_cpu_spec_min_p_logit_bias.py), on vLLM's real
V1 RejectionSampler and Sampler with CPU tensors and a fixed context.

Guards issue 47 item 1: vLLM 0.32 refused both options under speculation, and lifting the refusal alone processes the
bonus row only (the draft rows skip MinP and LogitBias), the wrong answer that looks right. Here every case runs the
patched sampler and the bonus-only variant (vLLM's own draft-row functions, processors built): the first must match
the no-speculation distribution within the bound, the second must not.

Fixed context: :data:`LOGITS` are the target's raw logits at the verified positions of one step (2 draft rows, then
the bonus row). The no-speculation reference is vLLM's own Sampler (``processed_logprobs``) on each row: the exact
processed distribution p_j. One step's output is the drafts accepted, then one token: the exact probability of
output (d_0..d_{m-1}, x) is p_0(d_0)...p_{m-1}(d_{m-1}) p_m(x), x != d_m unless m = 2 (the bonus row).

Bound: N = 40,000 steps per draft pair, K <= 3 x 10 outcomes. By the Bretagnolle-Huber-Carol inequality
P(TV(empirical, exact) >= t) <= 2^K exp(-2 N t^2); with t = TV_BOUND = 0.025 that is 2^30 e^-50 < 3e-13, so a
correct sampler never fails, while every bonus-only case below is >= 0.06 away (each case asserts its own gap).
Seeds are fixed, so a build passes or fails reproducibly.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.unit

V = 10
LOGITS = torch.tensor(
    [  # [2 draft rows + bonus row, V]: the target's raw logits of one step, a fixed context
        [2.0, 1.6, 1.2, 0.9, 0.5, 0.2, -0.3, -0.6, -1.0, -2.0],
        [0.4, 2.2, 1.9, 1.0, 0.7, 0.1, 0.0, -0.4, -1.5, -3.0],
        [1.5, 0.3, 1.8, 2.1, 0.6, 0.6, -0.2, -1.0, -0.5, -2.5],
    ]
)
TAIL_DRAFTS = (5, 2)  # a draft pair whose first token min_p masks or the bias makes rarer
N, BATCH, TV_BOUND = 40_000, 4_000, 0.025
BIAS = {4: 2.5, 0: -1.5, 9: 4.0}

CASES = {  # name -> SamplingParams keywords (each random)
    "min_p": dict(min_p=0.2),
    "min_p_temperature": dict(min_p=0.3, temperature=0.7),
    "min_p_top_p": dict(min_p=0.25, top_p=0.8),
    "min_p_top_k": dict(min_p=0.3, top_k=8, temperature=1.3),
    "logit_bias": dict(logit_bias=BIAS),
    "logit_bias_temperature": dict(logit_bias=BIAS, temperature=0.6),
    "logit_bias_top_p": dict(logit_bias=BIAS, top_p=0.7),
    "logit_bias_top_k": dict(logit_bias=BIAS, top_k=4),
    "all": dict(logit_bias=BIAS, min_p=0.1, temperature=0.9, top_k=7, top_p=0.9),
}


@pytest.fixture(scope="module")
def patched():
    """vLLM's CPU kernel overrides registered as in a worker, and the three sampling patches applied."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_spec_expand, vllm_cpu_spec_min_p_logit_bias, vllm_cpu_top_k_empty

    if not current_platform.is_cpu() or HAS_TRITON:
        pytest.skip("the patch is for vLLM-CPU's V1 runner")
    import sys

    foreign = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("llvmlite", "numba")}  # see
    for name in foreign:  # tests/unit/test_sampling_patch.py: they break vLLM's registration scan
        del sys.modules[name]
    try:
        current_platform.register_triton_kernel_overrides()
    finally:
        sys.modules.update(foreign)
    for patch in (vllm_cpu_spec_expand.PATCH, vllm_cpu_top_k_empty.PATCH, vllm_cpu_spec_min_p_logit_bias.PATCH):
        record = model_patches.apply(patch, "0.32.0")
        assert "skipped" not in record, record
    return vllm_cpu_spec_min_p_logit_bias


# ------------------------------------------------------------------------------------------------- harness


def sampling_metadata(params, batch: int, drafts, prompt: list[int] | None = None, outputs=None):
    """``batch`` requests with the same SamplingParams (and ``prompt``; ``outputs``: each one's tokens so far, default
    none), processors built and updated as the V1 input batch does."""
    from vllm.v1.sample import logits_processor
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.metadata import SamplingMetadata

    config = SimpleNamespace(speculative_config=object(), scheduler_config=SimpleNamespace(max_num_seqs=batch))
    procs = logits_processor.build_logitsprocs(config, torch.device("cpu"), False, False)
    update = BatchUpdate(batch_size=batch, removed=[], added=[(i, params, prompt, []) for i in range(batch)], moved=[])
    for proc in procs.all:
        proc.update_state(update)
    greedy = params.temperature == 0.0
    penalties = params.repetition_penalty != 1.0
    return SamplingMetadata(
        temperature=None if greedy else torch.full((batch,), params.temperature),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=None if params.top_p == 1.0 else torch.full((batch,), params.top_p),
        top_k=None if params.top_k in (0, -1) else torch.full((batch,), params.top_k, dtype=torch.int32),
        generators={},
        max_num_logprobs=None,
        no_penalties=not penalties,
        prompt_token_ids=torch.tensor([prompt] * batch) if penalties else None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.full((batch,), params.repetition_penalty),
        output_token_ids=outputs or [[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=procs,
        spec_token_ids=[list(drafts)] * batch,
    )


def spec_step(params, drafts, batch: int, prompt=None) -> list[tuple[int, ...]]:
    """One speculative step of ``batch`` requests, all in the fixed context with the same greedy drafts; the output
    tokens of each (accepted drafts, then the recovered or bonus token)."""
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    k = len(drafts)
    rows = torch.arange(batch * (k + 1)).view(batch, k + 1)  # request i's rows: k drafts, then its bonus row
    meta = SpecDecodeMetadata(
        draft_token_ids=torch.tensor(list(drafts) * batch, dtype=torch.int32),
        num_draft_tokens=[k] * batch,
        cu_num_draft_tokens=torch.arange(1, batch + 1, dtype=torch.int32) * k,
        cu_num_sampled_tokens=torch.arange(1, batch + 1, dtype=torch.int32) * (k + 1),
        target_logits_indices=rows[:, :k].flatten(),
        bonus_logits_indices=rows[:, k],
        logits_indices=rows.flatten(),
    )
    logits = LOGITS[: k + 1].repeat(batch, 1)  # [batch * (k + 1), V]
    out = RejectionSampler(Sampler())(meta, None, logits, sampling_metadata(params, batch, drafts, prompt))
    return [tuple(t for t in row if t != PLACEHOLDER_TOKEN_ID) for row in out.sampled_token_ids.tolist()]


def no_spec_probs(params) -> torch.Tensor:
    """The exact next-token distribution at each row of :data:`LOGITS` without speculation: vLLM's Sampler,
    processed logprobs. [3, V]"""
    from vllm.v1.sample.sampler import Sampler

    meta = sampling_metadata(params, LOGITS.shape[0], ())
    out = Sampler(logprobs_mode="processed_logprobs")(
        LOGITS.clone(), meta.__class__(**{**meta.__dict__, "max_num_logprobs": -1})
    )
    return out.logprobs_tensors.logprobs.exp()


def exact_outcomes(p: torch.Tensor, drafts) -> dict[tuple[int, ...], float]:
    """P(one step outputs (d_0..d_{m-1}, x)) without speculation, from the per-row distributions ``p``."""
    dist, prefix = {}, 1.0
    for m in range(len(drafts) + 1):
        for x in range(V):
            if m < len(drafts) and x == drafts[m]:
                continue
            dist[(*drafts[:m], x)] = prefix * float(p[m, x])
        if m < len(drafts):
            prefix *= float(p[m, drafts[m]])
    return dist


def tv_distance(samples: list[tuple[int, ...]], exact: dict) -> float:
    from collections import Counter

    counts = Counter(samples)
    return 0.5 * sum(abs(counts.get(o, 0) / len(samples) - exact.get(o, 0.0)) for o in set(counts) | set(exact))


def measured_tv(params, drafts, seed: int) -> float:
    torch.manual_seed(seed)
    samples = [o for _ in range(N // BATCH) for o in spec_step(params, drafts, BATCH)]
    return tv_distance(samples, exact_outcomes(no_spec_probs(params), drafts))


def drafts_of(params) -> tuple[tuple[int, int], ...]:
    """The likeliest draft pair under the processed distribution (steps that reach the bonus row), and
    :data:`TAIL_DRAFTS`."""
    p = no_spec_probs(params)
    return (int(p[0].argmax()), int(p[1].argmax())), TAIL_DRAFTS


def params_of(case: dict):
    from vllm.sampling_params import SamplingParams

    return SamplingParams(**{"temperature": 1.0, **case})


@pytest.fixture
def bonus_only(patched, monkeypatch):
    """The refusal lifted and the processors built, but the draft rows given vLLM's own processing: what
    re-enabling the processors alone would serve."""
    from vllm.v1.sample import rejection_sampler

    monkeypatch.setattr(
        rejection_sampler.RejectionSampler, "apply_logits_processors", patched.stock("apply_logits_processors")
    )
    monkeypatch.setattr(rejection_sampler, "apply_sampling_constraints", patched.stock("apply_sampling_constraints"))


# ------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CASES))
def test_sampled_under_speculation_is_the_no_speculation_distribution(patched, name):
    """Both draft pairs: the first output tokens of a step are distributed as without speculation (TV < bound)."""
    params = params_of(CASES[name])
    raw = no_spec_probs(params_of({k: v for k, v in CASES[name].items() if k not in ("min_p", "logit_bias")}))
    processed = no_spec_probs(params)
    assert (processed - raw).abs().sum(-1).min() > 0.1, "the case does not exercise the processor at every row"
    for i, drafts in enumerate(drafts_of(params)):
        tv = measured_tv(params, drafts, seed=i)
        print(f"{name} drafts {drafts}: TV {tv:.4f} (N {N}, bound {TV_BOUND})")
        assert tv < TV_BOUND, f"{name}, drafts {drafts}: TV {tv:.4f} >= {TV_BOUND} from the no-speculation distribution"


@pytest.mark.parametrize("name", list(CASES))
def test_bonus_only_processing_fails_the_same_bound(bonus_only, name):
    """The same measurement with the processors on the bonus row only exceeds the bound (for at least one draft
    pair): the test above tells the two apart."""
    params = params_of(CASES[name])
    tvs = [measured_tv(params, drafts, seed=i) for i, drafts in enumerate(drafts_of(params))]
    print(f"{name} bonus-only: TV {[round(t, 4) for t in tvs]} (N {N}, bound {TV_BOUND})")
    assert max(tvs) > 2 * TV_BOUND, f"{name}: bonus-only processing is not told apart (TV {tvs})"


GREEDY_DRAFTS = [(a, b) for a in (0, 1, 4, 9) for b in (1, 2, 4, 9)]


def greedy_no_spec(params, drafts=(), prompt=None) -> list[int]:
    """vLLM's Sampler's greedy token at each row of :data:`LOGITS` (bias and penalties applied), row j after the
    output ``drafts[:j]`` (what the penalties count)."""
    from vllm.v1.sample.sampler import Sampler

    outputs = [list(drafts[:j]) for j in range(LOGITS.shape[0])]
    meta = sampling_metadata(params, LOGITS.shape[0], (), prompt, outputs)
    return Sampler()(LOGITS.clone(), meta).sampled_token_ids.flatten().tolist()


def greedy_expected(want: list[int], drafts) -> tuple[int, ...]:
    m = 0
    while m < len(drafts) and drafts[m] == want[m]:
        m += 1
    return (*drafts[:m], want[m])


@pytest.mark.parametrize("extra", [{}, {"repetition_penalty": 2.0}], ids=["bias", "bias_repetition_penalty"])
def test_greedy_with_logit_bias_is_token_identical(patched, extra):
    """Greedy + logit_bias: every draft pair's step outputs exactly the tokens non-speculative greedy gives (the biased
    argmax at each position; with a repetition penalty the bias comes first, as in vLLM's Sampler)."""
    from vllm.sampling_params import SamplingParams

    # Row 0, token 7 (in the prompt): raw -0.6, bias first (+4.5, then /2) 1.95 < token 4's 3.0; penalty first
    # (x2, then +4.5) 3.3 > 3.0. The bias applied after the penalty on draft rows fails all 16 draft pairs (seen).
    bias = {9: 4.0, 4: 2.5, 7: 4.5}
    params = SamplingParams(temperature=0.0, logit_bias=bias, **extra)
    prompt = [3, 7] if extra else None
    unbiased = SamplingParams(temperature=0.0, **extra)
    assert greedy_no_spec(params, (), prompt) != greedy_no_spec(unbiased, (), prompt), "the bias moves no argmax"
    for drafts in GREEDY_DRAFTS:
        want = greedy_no_spec(params, drafts, prompt)
        assert spec_step(params, drafts, 1, prompt) == [greedy_expected(want, drafts)], (drafts, want)


def test_greedy_bonus_only_is_not_identical(bonus_only):
    """Bonus-only processing: some draft the unbiased argmax agrees with is accepted against the biased target."""
    from vllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, logit_bias={9: 4.0, 4: 2.5})
    want = greedy_no_spec(params)
    wrong = [d for d in GREEDY_DRAFTS if spec_step(params, d, 1) != [greedy_expected(want, d)]]
    assert wrong, "bonus-only processing gave the non-speculative tokens"


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_guard_lifted_for_exactly_min_p_and_logit_bias(patched, monkeypatch, v2):
    """vLLM's request check under speculation: min_p and logit_bias pass (stock refuses them) on the V1 runner and on
    Model Runner V2 (its own sampler processes every verified row); synthetic acceptance keeps the refusal; the check
    still runs on the rest of the request."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    spec = SimpleNamespace(rejection_sample_method="standard")  # all _validate_spec_decode reads of the config
    params = SamplingParams(min_p=0.1, logit_bias={10: 5.0}, temperature=0.8)
    with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
        patched.stock("_validate_spec_decode")(params, spec)
    params._validate_spec_decode(spec)
    params._validate_spec_decode(SimpleNamespace(rejection_sample_method="block"))
    assert params.min_p == 0.1 and params.logit_bias == {10: 5.0}  # the request itself is untouched
    with pytest.raises(VLLMValidationError, match="not yet supported with speculative decoding"):
        params._validate_spec_decode(SimpleNamespace(rejection_sample_method="synthetic"))


def test_builtin_processors_under_speculation_custom_still_refused(patched):
    """Under speculation the V1 input batch gets MinP, LogitBias and MinTokens; custom processors keep vLLM's
    start-up refusal."""
    from vllm.v1.sample import logits_processor
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )

    config = SimpleNamespace(speculative_config=object(), scheduler_config=SimpleNamespace(max_num_seqs=4))
    procs = logits_processor.build_logitsprocs(config, torch.device("cpu"), False, False)
    assert {type(p) for p in procs.all} == {MinPLogitsProcessor, LogitBiasLogitsProcessor, MinTokensLogitsProcessor}
    stock = patched.stock("build_logitsprocs")(config, torch.device("cpu"), False, False)
    assert [type(p) for p in stock.all] == [MinTokensLogitsProcessor]  # when this fails, vLLM builds them itself
    with pytest.raises(ValueError, match=logits_processor.STR_SPEC_DEC_REJECTS_LOGITSPROCS):
        logits_processor.build_logitsprocs(config, torch.device("cpu"), False, False, [MinPLogitsProcessor])
