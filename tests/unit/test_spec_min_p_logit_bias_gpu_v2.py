"""GPU vLLM: ``min_p`` and ``logit_bias`` accepted under speculation where Model Runner V2 verifies, refused elsewhere
(vllm_eagle3/model_patches/vllm_v2_spec_min_p_logit_bias.py).

Guards issue 47 item 1 on GPU: vLLM answered 400 to both under speculation on every runner, though V2's rejection
sampler processes every verified row; and the lift must not reach the V1 runner (bonus row only: wrong output that
looks right), another worker's runner, or synthetic / fly acceptance. The configs are real ``VllmConfig`` objects
(``EngineArgs.create_engine_config``, the bundled miniature with its EAGLE-3 head, k = 3) built as a GPU would build
them: vLLM's GPU worker class and Triton present (``vllm.config.vllm.HAS_TRITON``, as ``vllm-eagle3 emulate v2``
sets it; vLLM-CPU hides Triton), the runner by ``VLLM_USE_V2_MODEL_RUNNER``. The requests are real ``SamplingParams``
checked by vLLM's own ``verify``, as the API server's ``InputProcessor`` calls it. On CPU the patch's ``needed_fn``
skips it, so the module applies its functions itself and restores vLLM's own afterwards. No engine, no GPU.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm.exceptions import VLLMValidationError

from vllm_eagle3.model_patches import vllm_cpu_spec_min_p_logit_bias as on_cpu
from vllm_eagle3.model_patches import vllm_v2_spec_min_p_logit_bias as v2

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
REFUSED = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding"
GPU_WORKER = "vllm.v1.worker.gpu_worker.Worker"


def build(mp, *, use_v2: bool, worker: str = GPU_WORKER, speculative: bool = True, **spec):
    from vllm.engine.arg_utils import EngineArgs

    mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if use_v2 else "0")
    return EngineArgs(
        model=str(REPO / "models" / "kimi-k25-mini"),
        dtype="float32",
        max_model_len=256,
        worker_cls=worker,
        speculative_config=(
            {"method": "eagle3", "num_speculative_tokens": 3, "model": str(REPO / "models" / "kimi-k25-mini-eagle3")}
            | spec
            if speculative
            else None
        ),
    ).create_engine_config()


@pytest.fixture(scope="module")
def configs():
    """The patch applied (vLLM's own functions put back at the end) and the configs built under it."""
    import vllm.config.vllm
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as create_engine_config does: on CPU the plugin wraps _validate_spec_decode first
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(VllmConfig, "__post_init__", v2.stock("__post_init__"))
        mp.setattr(SamplingParams, "_validate_spec_decode", on_cpu.stock("_validate_spec_decode"))
        mp.setattr(v2, "_stock", {})
        mp.setattr(vllm.config.vllm, "HAS_TRITON", True)  # a GPU has Triton; vLLM-CPU refuses V2 without it
        v2._apply()
        built = {
            "v2": build(mp, use_v2=True),
            "v1": build(mp, use_v2=False),
            "synthetic": build(mp, use_v2=True, rejection_sample_method="synthetic", synthetic_acceptance_length=2.0),
            "cpu worker": build(mp, use_v2=True, worker="vllm.v1.worker.cpu_worker.CPUWorker"),
            "no speculation": build(mp, use_v2=True, speculative=False),
        }
        mp.delenv("VLLM_USE_V2_MODEL_RUNNER")
        yield built


def check(cfg, **params) -> None:
    """vLLM's own request check, as the API server runs it (``InputProcessor._validate_params``)."""
    from vllm.sampling_params import SamplingParams

    SamplingParams(**params).verify(cfg.model_config, cfg.speculative_config, cfg.structured_outputs_config, None)


SERVED_ON_V2 = [
    {"min_p": 0.1},
    {"logit_bias": {5: 100.0, 7: -100.0}},
    {"min_p": 0.05, "logit_bias": {3: -100.0}, "temperature": 0.7, "top_p": 0.9, "top_k": 20},
    {"logit_bias": {5: 5.0}, "temperature": 0.0},
]


@pytest.mark.parametrize("params", SERVED_ON_V2, ids=lambda p: ",".join(p))
def test_v2_serves_min_p_and_logit_bias(configs, params):
    """On V2 the request passes vLLM's own checks: its rejection sampler biases and min-p-masks every verified row."""
    cfg = configs["v2"]
    assert cfg.parallel_config.worker_cls == GPU_WORKER
    assert getattr(cfg.speculative_config, v2.VERIFIED_BY_V2) is True
    check(cfg, **params)


@pytest.mark.parametrize("which", ["v1", "synthetic", "cpu worker"])
@pytest.mark.parametrize("params", SERVED_ON_V2[:2], ids=lambda p: ",".join(p))
def test_refused_where_not_exact(configs, which, params):
    """vLLM's own 400, word for word: the V1 runner processes the bonus row only; synthetic acceptance keeps drafts
    whatever the target says; another worker class builds a runner and sampler the patch does not know (here vLLM-CPU's,
    which vllm_cpu_spec_min_p_logit_bias serves on CPU)."""
    with pytest.raises(VLLMValidationError, match=REFUSED):
        check(configs[which], **params)


def test_v1_is_what_vllm_chose(configs, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the property reads it each time; the mark was set at build
    assert configs["v1"].use_v2_model_runner is False
    assert getattr(configs["v1"].speculative_config, v2.VERIFIED_BY_V2) is False


def test_other_refusals_stay(configs):
    """Only min_p / logit_bias are taken out of the check: a request vLLM refuses for another reason still is, with
    vLLM's reason, min_p or not."""
    vocab = configs["v2"].model_config.get_vocab_size()
    with pytest.raises(VLLMValidationError, match="greater than max allowed"):
        check(configs["v2"], min_p=0.1, logprobs=10**6)
    with pytest.raises(VLLMValidationError, match="out-of-vocab token ids"):
        check(configs["v2"], logit_bias={vocab + 5: 1.0})


def test_without_speculation_nothing_changes(configs):
    assert configs["no speculation"].speculative_config is None
    check(configs["no speculation"], min_p=0.1, logit_bias={5: 1.0})


def test_plain_requests_pass_everywhere(configs):
    for cfg in configs.values():
        check(cfg, temperature=0.8, top_p=0.9)


def test_fly_keeps_the_refusal():
    """'fly' (vLLM 0.33+, not buildable on 0.32) defers rejections it cannot later undo: no output is the target's."""
    spec = SimpleNamespace(rejection_sample_method="fly", **{v2.VERIFIED_BY_V2: True})
    assert not v2.exact_under(spec)
    assert v2.exact_under(SimpleNamespace(rejection_sample_method="block", **{v2.VERIFIED_BY_V2: True}))
    assert not v2.exact_under(SimpleNamespace(rejection_sample_method="standard"))  # unmarked: refused


def test_a_shared_speculative_config_stays_refused_once_any_config_says_v1(configs, monkeypatch):
    """A config built again around the same speculative config (vLLM's ``replace``) re-marks it; V2 only while every
    one of them says V2."""
    cfg = copy.deepcopy(configs["v2"])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    v2.mark(cfg)
    assert getattr(cfg.speculative_config, v2.VERIFIED_BY_V2) is False
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    v2.mark(cfg)
    assert getattr(cfg.speculative_config, v2.VERIFIED_BY_V2) is False
    assert getattr(configs["v2"].speculative_config, v2.VERIFIED_BY_V2) is True  # the copy's mark, not the original's


def test_not_needed_on_cpu():
    """vLLM-CPU keeps vllm_cpu_spec_min_p_logit_bias (both runners); this patch is for every other platform."""
    needed, reason = v2.PATCH.needed_fn()
    assert not needed and "cpu" in reason
