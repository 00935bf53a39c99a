"""Unit tests of the vLLM plugin's own logic (no engine): version guard, patch bookkeeping, PP tap placement.

Each guards a silent failure: an unsupported vLLM capturing wrong taps, a patch applied twice or silently
on the wrong version, a pipeline stage dropping a tap.
"""

from __future__ import annotations

import pytest

from model_patches import Patch, PatchVersionError, applied_patches, apply

pytestmark = pytest.mark.unit


def test_unsupported_vllm_version_names_installed_and_supported():
    """A vLLM outside 0.32/0.33 fails at registration, naming both versions."""
    from vllm_eagle3.compat import UnsupportedVersionError, check_vllm_version

    assert check_vllm_version("0.32.0") == "0.32.0"
    assert check_vllm_version("0.33.1") == "0.33.1"
    with pytest.raises(UnsupportedVersionError, match=r"supports vLLM 0\.32\.x, 0\.33\.x but vLLM 0\.34\.0 is installed"):
        check_vllm_version("0.34.0")


def test_patch_is_version_guarded_idempotent_and_recorded():
    """Applying twice runs the patch once; the record lists it; a wrong version names installed vs supported."""
    calls = []
    patch = Patch(name="unit_test_patch", engine="vllm", supported=("0.32.",), retire_when="upstream PR X",
                  apply_fn=lambda: calls.append(1) or "did it")
    first = apply(patch, "0.32.0")
    assert apply(patch, "0.32.0") == first
    assert calls == [1]
    assert first in applied_patches() and "did it" in first
    other = Patch(name="unit_test_patch_2", engine="vllm", supported=("0.32.",), retire_when="upstream PR X",
                  apply_fn=lambda: "never")
    with pytest.raises(PatchVersionError, match=r"written for vllm 0\.32\.x but vllm 0\.31\.0 is installed"):
        apply(other, "0.31.0")
    assert not any(r.startswith("unit_test_patch_2") for r in applied_patches())


def test_cpu_block_size_patch_declares_16():
    """The CPU attention backend declares MultipleOf(16) after the patch (DeepSeek target + Llama draft on CPU)."""
    from vllm import __version__
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from model_patches.vllm_plugin import register

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
