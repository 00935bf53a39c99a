"""vLLM-CPU (V1 runner, Model Runner V2): ``min_p`` and ``logit_bias`` served under speculation, exact at every
verified position.

Why: vLLM 0.32 answers 400 to any request with ``min_p`` or ``logit_bias`` once a speculative config is set
(``SamplingParams._validate_spec_decode``), builds only the MinTokens logits processor under speculation
(``v1/sample/logits_processor/__init__.py`` ``build_logitsprocs``), and its V1 rejection sampler gives the draft
rows neither processor (``RejectionSampler.apply_logits_processors`` runs penalties, allowed ids, bad words and
MinTokens; ``apply_sampling_constraints`` temperature, top-k/top-p). Lifting the guard alone would process the
bonus row only: the wrong answer that looks right. The project's soak got 18 % of its requests refused for this.

The patch (V1 runner, vLLM-CPU only) gives every verified row, draft rows and bonus row, the plain Sampler's order:
logit bias before penalties (so greedy takes the biased argmax at each position), then temperature, min-p, top-k /
top-p (so random sampling accepts and recovers against the processed target distribution, exactly as without
speculation; the draft's proposal distribution does not enter the processed target). Pieces, each vLLM's own code:
- ``build_logitsprocs``: under speculation, vLLM's builtin processors (MinP, LogitBias, MinTokens), which the bonus
  row's Sampler applies as without speculation; custom processors keep vLLM's start-up refusal.
- ``RejectionSampler.apply_logits_processors``: ``LogitBiasLogitsProcessor.apply`` on the draft rows first.
- ``rejection_sampler.apply_sampling_constraints``: vLLM's temperature, ``MinPLogitsProcessor.apply`` on the draft
  rows, vLLM's top-k/top-p.
- ``SamplingParams._validate_spec_decode``: vLLM's check of the request less ``min_p`` / ``logit_bias``, so anything
  else it refuses still gets its 400. On Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``) too: its rejection sampler
  runs ``Sampler.apply_sampling_params`` (bias, penalties, temperature, min-p, top-k/top-p) on draft and bonus rows
  alike (``v1/worker/gpu/spec_decode/rejection_sampler.py`` ``_verify``), so there the lifted guard is all it takes.
  Under ``rejection_sample_method="synthetic"`` (drafts accepted at set rates, whatever the target says) nothing is
  exact: the refusal stays whole on both runners.
Guarded by tests/unit/test_spec_min_p_logit_bias.py (vLLM's real RejectionSampler: distributions against the exact
ones; bonus-only processing fails the same bound), tests/e2e/test_sampling_options.py (served, greedy identical) and
tests/e2e/test_spec_min_p_logit_bias_v2.py (V2's own step loop: greedy identical, distributions).

Retire when: vLLM's V1 rejection sampler applies argmax-invariant and bias processors to draft rows (vLLM #42744,
#42802 min_p, #38202 logit_bias) and drops the guard. Only applied on CPU; on GPU vLLM,
:mod:`~vllm_eagle3.model_patches.vllm_v2_spec_min_p_logit_bias` lifts the refusal where Model Runner V2 verifies.
"""

from __future__ import annotations

from types import SimpleNamespace

from vllm_eagle3.compat import supported_vllm_before
from vllm_eagle3.model_patches import Patch, vllm_cpu_only

_MARK = "_vllm_eagle3_spec_min_p_logit_bias"
_stock: dict = {}  # name -> vLLM's own function, kept when the patch wraps it


def stock(name: str):
    """vLLM's own ``build_logitsprocs`` / ``apply_logits_processors`` / ``apply_sampling_constraints`` /
    ``_validate_spec_decode``, whether or not this process applied the patch (tests)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample import logits_processor, rejection_sampler

    here = {
        "build_logitsprocs": logits_processor.build_logitsprocs,
        "apply_logits_processors": rejection_sampler.RejectionSampler.apply_logits_processors,
        "apply_sampling_constraints": rejection_sampler.apply_sampling_constraints,
        "_validate_spec_decode": SamplingParams._validate_spec_decode,
    }
    return _stock.get(name) or here[name]


def _processor(sampling_metadata, cls):
    """The live processor of type ``cls`` in this batch's metadata, or None."""
    return next((p for p in sampling_metadata.logitsprocs.all if isinstance(p, cls)), None)


def draft_row_requests(num_draft_tokens: list[int], device) -> "torch.Tensor":  # noqa: F821
    """The request of each draft row. E.g., [2, 0, 3] -> [0, 0, 2, 2, 2]."""
    import torch

    counts = torch.tensor(num_draft_tokens, dtype=torch.long)
    return torch.arange(len(num_draft_tokens)).repeat_interleave(counts).to(device)


def bias_draft_rows(logits, sampling_metadata, num_draft_tokens: list[int]):
    """vLLM's ``LogitBiasLogitsProcessor.apply`` on the draft rows: its (request, token) entries moved to rows."""
    from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor

    proc = _processor(sampling_metadata, LogitBiasLogitsProcessor)
    if proc is None or not proc.biases or logits.shape[0] == 0:
        return logits
    reqs, toks = proc.logits_slice  # [num_entries] each
    row_req = draft_row_requests(num_draft_tokens, logits.device)  # [num_tokens]
    rows, entries = (row_req[:, None] == reqs[None, :].long()).nonzero(as_tuple=True)
    per_row = SimpleNamespace(
        biases=proc.biases, logits_slice=(rows, toks[entries].long()), bias_tensor=proc.bias_tensor[entries]
    )
    return LogitBiasLogitsProcessor.apply(per_row, logits)


INEXACT_METHODS = ("synthetic",)
"""``SpeculativeConfig.rejection_sample_method`` values whose output is not the target's whatever the processors do."""


def exact_under(speculative_config) -> bool:
    """Whether min_p and logit_bias are exact under ``speculative_config``: on the V1 runner through this patch, on
    Model Runner V2 through its own sampler; not under synthetic acceptance."""
    return getattr(speculative_config, "rejection_sample_method", "standard") not in INEXACT_METHODS


def lifted(validate, exact):
    """``SamplingParams._validate_spec_decode`` less its min_p / logit_bias refusal where ``exact(speculative_config)``
    (vLLM's ``validate`` on the request with both cleared, so anything else it refuses keeps its 400); vLLM's check
    as is elsewhere. One body for this patch and the GPU V2 one, which differ only in ``exact``."""
    import msgspec

    def _validate_spec_decode(self, speculative_config):
        if speculative_config is None or not exact(speculative_config):
            return validate(self, speculative_config)
        return validate(msgspec.structs.replace(self, min_p=0.0, logit_bias=None), speculative_config)

    return _validate_spec_decode


def _apply() -> str:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample import logits_processor, rejection_sampler
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    if getattr(rejection_sampler.apply_sampling_constraints, _MARK, False):
        return "already patched"
    build, apply_lp = logits_processor.build_logitsprocs, rejection_sampler.RejectionSampler.apply_logits_processors
    constraints, validate = rejection_sampler.apply_sampling_constraints, SamplingParams._validate_spec_decode
    _stock.update(
        build_logitsprocs=build,
        apply_logits_processors=apply_lp,
        apply_sampling_constraints=constraints,
        _validate_spec_decode=validate,
    )

    def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=()):
        if not vllm_config.speculative_config or is_pooling_model or custom_logitsprocs:
            return build(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        return logits_processor.LogitsProcessors(
            ctor(vllm_config, device, is_pin_memory) for ctor in logits_processor.BUILTIN_LOGITS_PROCESSORS
        )

    def apply_logits_processors(self, logits, sampling_metadata, metadata):
        logits = bias_draft_rows(logits, sampling_metadata, metadata.num_draft_tokens)  # before penalties, as Sampler
        return apply_lp(self, logits, sampling_metadata, metadata)

    def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
        from dataclasses import replace

        import torch

        min_p = _processor(sampling_metadata, MinPLogitsProcessor)
        if sampling_metadata.all_greedy or min_p is None or not min_p.min_p_count or logits.shape[0] == 0:
            return constraints(logits, cu_num_draft_tokens, sampling_metadata)
        # vLLM's temperature alone, then min-p per row, then vLLM's top-k/top-p (temperature 1: x / 1.0 == x).
        logits = constraints(logits, cu_num_draft_tokens, replace(sampling_metadata, top_k=None, top_p=None))
        per_row = rejection_sampler.expand_batch_to_tokens(  # [num_tokens]
            min_p.min_p[:, 0].contiguous(), cu_num_draft_tokens, logits.shape[0]
        )
        logits = MinPLogitsProcessor.apply(SimpleNamespace(min_p_count=1, min_p=per_row[:, None]), logits)
        ones = torch.ones_like(sampling_metadata.temperature)
        return constraints(logits, cu_num_draft_tokens, replace(sampling_metadata, temperature=ones))

    _validate_spec_decode = lifted(validate, exact_under)

    for fn, original in (
        (build_logitsprocs, build),
        (apply_logits_processors, apply_lp),
        (apply_sampling_constraints, constraints),
        (_validate_spec_decode, validate),
    ):
        fn.__doc__ = original.__doc__
        setattr(fn, _MARK, True)
    logits_processor.build_logitsprocs = build_logitsprocs
    import sys

    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")  # imported later, it binds the patched name itself
    if runner is not None:
        runner.build_logitsprocs = build_logitsprocs
    rejection_sampler.RejectionSampler.apply_logits_processors = apply_logits_processors
    rejection_sampler.apply_sampling_constraints = apply_sampling_constraints  # forward() looks it up at call time
    SamplingParams._validate_spec_decode = _validate_spec_decode
    return (
        "min_p and logit_bias served under speculation: V1 processors built and applied to draft rows (bias "
        "before penalties, min-p after temperature); SamplingParams refusal lifted for exactly these two (V1 and "
        "V2, whose own sampler processes every row), kept under synthetic acceptance"
    )


PATCH = Patch(
    name="vllm_cpu_spec_min_p_logit_bias",
    engine="vllm",
    supported=supported_vllm_before("0.33"),
    retire_when=(
        "vLLM's V1 rejection sampler applying min_p and logit_bias to draft rows (vLLM #42744, #42802, "
        "#38202) and dropping SamplingParams._validate_spec_decode's refusal"
    ),
    apply_fn=_apply,
    needed_fn=vllm_cpu_only,
)
