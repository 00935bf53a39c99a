"""GPU vLLM on Model Runner V2: requests with ``min_p`` or ``logit_bias`` served under speculation, not refused.

Why: vLLM 0.32-0.34 answer 400 to any request with ``min_p`` or ``logit_bias`` once a speculative config is set
(``SamplingParams._validate_spec_decode``), whatever runner verifies. Model Runner V2's rejection sampler runs
``Sampler.apply_sampling_params`` (logit bias before penalties, then temperature, min-p, top-k/top-p) on draft and
bonus rows alike before ``rejection_sample`` (``v1/worker/gpu/spec_decode/rejection_sampler.py``
``RejectionSampler._verify``, the same pass in 0.32, 0.33, 0.34), so on V2 the refusal is all that stands in the way:
greedy takes the biased argmax at every position, sampling accepts and recovers against the processed target. The V1
runner (0.32, 0.33: ``VLLM_USE_V2_MODEL_RUNNER=0``, or a feature V2 lacks) gives the draft rows neither: there the
refusal stays (lifting it would process the bonus row only, the wrong answer that looks right). GPU users serve
Kimi K2.5 on V2, the only runner 0.34 has.

What it wraps, each calling vLLM's own:
- ``VllmConfig.__post_init__``: once vLLM's body has finished (runner and worker class final), the config's
  ``speculative_config`` is marked with whether V2's sampler verifies it: vLLM's in-tree GPU or XPU worker
  (``parallel_config.worker_cls``) building V2 (``use_v2_model_runner``, by
  :func:`vllm_eagle3.online.runners.runner_in_use`; absent in 0.34: V2). Another worker class builds its own runner
  and sampler: marked False. A speculative config shared by several configs stays marked only while all say V2
  (derived views skipped, as vLLM's body skips them). The API server validates requests against this same object
  (``InputProcessor.speculative_config``).
- ``SamplingParams._validate_spec_decode``: on a marked config under an exact rejection method, vLLM's check of the
  request less ``min_p`` / ``logit_bias``, so anything else it refuses keeps its 400; otherwise vLLM's check as is.
  Under ``rejection_sample_method="synthetic"`` (drafts accepted at set rates) and ``"fly"`` (0.33+: lossy,
  entropy-gated deferral keeps drafts the target rejected) nothing is exact: the refusal stays whole.
Not applied on vLLM's CPU platform: :mod:`~vllm_eagle3.model_patches.vllm_cpu_spec_min_p_logit_bias` does it there,
both runners.

No GPU here can run vLLM. The GPU path of V2's sampler is vLLM's own code, exercised on CPU by
tests/e2e/test_spec_min_p_logit_bias_v2.py under ``vllm-eagle3 emulate v2`` (greedy identical, distributions).
Guarded by tests/unit/test_spec_min_p_logit_bias_gpu_v2.py (real ``VllmConfig`` and ``SamplingParams``: V2 accepts,
V1 and synthetic keep vLLM's 400, other refusals stay) and ``make compat`` (the wrapped bodies and V2's ``_verify`` /
``apply_sampling_params`` hashed and reviewed on 0.32, 0.33, 0.34).

Retire when: vLLM drops the refusal where its sampler processes every verified row (vLLM #42802 min_p, #38202
logit_bias).
"""

from __future__ import annotations

from vllm_eagle3.compat import SUPPORTED_VLLM
from vllm_eagle3.model_patches import Patch
from vllm_eagle3.model_patches import vllm_cpu_spec_min_p_logit_bias as on_cpu

_MARK = "_vllm_eagle3_v2_spec_min_p_logit_bias"  # on the wrappers: applied
VERIFIED_BY_V2 = "_vllm_eagle3_verified_by_v2_sampler"
"""Attribute set on a ``SpeculativeConfig``: whether Model Runner V2's sampler verifies its drafts (absent: unknown,
refused)."""
V2_SAMPLER_WORKERS = ("vllm.v1.worker.gpu_worker.Worker", "vllm.v1.worker.xpu_worker.XPUWorker")
"""vLLM's in-tree GPU / XPU workers: on V2 each builds ``v1/worker/gpu/model_runner.py``'s runner (or a subclass),
whose rejection sampler processes every row."""
INEXACT_METHODS = (*on_cpu.INEXACT_METHODS, "fly")
"""``rejection_sample_method`` values under which no output is the target's; ``"fly"`` exists from 0.33."""

_stock: dict = {}  # name -> vLLM's own function, kept when the patch wraps it


def stock(name: str):
    """vLLM's own ``__post_init__`` / ``_validate_spec_decode``, whether or not this process applied the patch
    (tests)."""
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

    here = {"__post_init__": VllmConfig.__post_init__, "_validate_spec_decode": SamplingParams._validate_spec_decode}
    return _stock.get(name) or here[name]


def verified_by_v2_sampler(vllm_config) -> bool:
    """Whether the engine ``vllm_config`` describes verifies drafts with V2's rejection sampler."""
    from vllm_eagle3.online.runners import runner_in_use

    return vllm_config.parallel_config.worker_cls in V2_SAMPLER_WORKERS and runner_in_use(vllm_config) == "V2"


def mark(vllm_config) -> None:
    """Mark ``vllm_config.speculative_config`` (if any) with :func:`verified_by_v2_sampler`; a config already marked
    False stays False. A derived view (``model_config.is_submodel_config``, which vLLM's body leaves unchecked too)
    marks nothing."""
    spec = vllm_config.speculative_config
    if spec is None or getattr(vllm_config.model_config, "is_submodel_config", False):
        return
    v2 = getattr(spec, VERIFIED_BY_V2, True) and verified_by_v2_sampler(vllm_config)
    object.__setattr__(spec, VERIFIED_BY_V2, v2)  # not a field: pydantic validates none on assignment, none here


def exact_under(speculative_config) -> bool:
    """Whether min_p and logit_bias are exact under ``speculative_config``: verified by V2's sampler, under a rejection
    method whose output is the target's."""
    return (
        getattr(speculative_config, VERIFIED_BY_V2, False)
        and on_cpu.exact_under(speculative_config)
        and getattr(speculative_config, "rejection_sample_method", "standard") not in INEXACT_METHODS
    )


def _apply() -> str:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

    if getattr(SamplingParams._validate_spec_decode, _MARK, False):
        return "already patched"
    post_init, validate = VllmConfig.__post_init__, SamplingParams._validate_spec_decode
    _stock.update(__post_init__=post_init, _validate_spec_decode=validate)

    def __post_init__(self):
        post_init(self)
        mark(self)

    _validate_spec_decode = on_cpu.lifted(validate, exact_under)

    for fn, original in ((__post_init__, post_init), (_validate_spec_decode, validate)):
        fn.__doc__ = original.__doc__
        setattr(fn, _MARK, True)
    VllmConfig.__post_init__ = __post_init__  # pydantic's validator looks it up on the class at each construction
    SamplingParams._validate_spec_decode = _validate_spec_decode
    return (
        "min_p and logit_bias served under speculation on Model Runner V2 (its sampler processes every verified row); "
        "the V1 runner, other workers, synthetic and fly acceptance keep vLLM's refusal"
    )


def not_cpu() -> tuple[bool, str]:
    """``needed_fn``: every vLLM platform but CPU, where the vLLM-CPU patch serves both runners."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return False, "platform is cpu: vllm_cpu_spec_min_p_logit_bias does it there"
    return True, ""


PATCH = Patch(
    name="vllm_v2_spec_min_p_logit_bias",
    engine="vllm",
    supported=SUPPORTED_VLLM,
    retire_when=(
        "vLLM dropping SamplingParams._validate_spec_decode's min_p / logit_bias refusal where Model Runner V2 "
        "verifies (vLLM #42802, #38202)"
    ),
    apply_fn=_apply,
    needed_fn=not_cpu,
)
