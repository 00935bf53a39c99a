"""The SGLang patch ``vllm_eagle3/model_patches/sglang_embed_tap.py`` keeps its contract on SGLang's real classes, in
both SGLang venvs: 0.5.23 (``.venv-sglang``) and 0.5.12.post1, the legacy rule (``.venv-sglang-legacy``).

Guards: a legacy-convention draft ([-1, 2, 30]) served by SGLang 0.5.23 either crashes ("captured 2 of 3 aux hidden
states") or, with a patch that silently applies to the wrong SGLang version or twice, captures the wrong taps.
The patch must refuse other SGLang versions (naming installed and supported versions), be a no-op when applied
twice, record itself, and replace exactly the one method DeepseekV3/KimiK25 inherit. Its effect on
the captured tensors is checked in ``test_sglang_parity.py`` (legacy ids -> taps 0/3/31, equal to transformers).
On 0.5.12.post1 the patch must also wrap ``DeepseekV2Model.forward`` (its capture loop adds ``None`` before layer 0);
on 0.5.23 it must not. Runs in each SGLang venv through ``sglang_harness/patch_check.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_sglang_legacy import LEGACY_PY
from test_sglang_parity import SGLANG_PY, require_sglang_env  # the one SGLang-venv check

pytestmark = pytest.mark.parity

REPO = Path(__file__).resolve().parents[2]


VENVS = {"0.5.23": (SGLANG_PY, "sglang-env"), "0.5.12.post1": (LEGACY_PY, "sglang-legacy-env")}


@pytest.fixture(scope="module", params=list(VENVS))
def check(request) -> dict:
    python, make_target = VENVS[request.param]
    require_sglang_env(python, make_target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    proc = subprocess.run(
        [str(python), str(REPO / "tests/parity/sglang_harness/patch_check.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, f"patch_check.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sglang_version"] == request.param
    return out


def test_patch_refuses_other_sglang_versions_loudly(check):
    """Applied to SGLang 0.5.22 it must raise, naming both versions, and change nothing."""
    assert check["applied_before"] == {}
    err = check["guard_error"]
    assert err is not None, "the version guard let sglang 0.5.22 through"
    assert "0.5.22" in err and "0.5.23" in err and "0.5.12.post1" in err, err
    assert check["patched_after_refusal"] is False


def test_patch_is_idempotent_and_recorded(check):
    """Applying twice is one application; the record names the patch, the target method and the SGLang version."""
    version = check["sglang_version"]
    assert check["replaced_method"] and check["idempotent"] and check["forward_idempotent"]
    assert check["forward_wrapped"] == (version == "0.5.12.post1"), (
        f"DeepseekV2Model.forward wrapped on sglang {version}: {check['forward_wrapped']}"
    )
    assert check["v3_inherits"], "DeepseekV3ForCausalLM (Kimi K2.5's language model) must see the patched method"
    assert check["applied"] == ["sglang_embed_tap.legacy_eagle3_ids"]
    assert check["details"]["target"].endswith("DeepseekV2ForCausalLM.set_eagle3_layers_to_capture")
    assert check["details"]["sglang_version"] == version
    assert check["applied_patches"] == [check["record"]]
    assert f"sglang_embed_tap.legacy_eagle3_ids: applied for sglang {version}" in check["record"], check["record"]
