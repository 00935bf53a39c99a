"""Static refusal of drafts that vLLM would reject only 10-80 s into start-up, with a traceback.

Each case was seen dying inside the engine on main before these checks (issue 13): a pickle-only draft, a draft
with no weights, a truncated safetensors file, an index naming a missing shard, a draft built for another target
hidden size. A target whose capture the plugin does not replace, given a spec that means other taps than vLLM's own
capture takes, used to be served with the spec silently ignored (issue 11).
"""

import json
import re

import pytest

from vllm_eagle3.checkpoint import DraftInfo, safetensors_shapes
from vllm_eagle3.resolve import resolve_capture
from vllm_eagle3.spec import CaptureSpecError

from test_resolve import H, L, V, make_draft

pytestmark = pytest.mark.unit


def test_pickle_only_draft_is_refused_with_the_conversion(tmp_path, target):
    d = make_draft(tmp_path)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(CaptureSpecError, match=r"only pickle weights \(pytorch_model.bin\).*safetensors only.*"
                                               r"save_file"):
        resolve_capture(target, d, convention="sglang-legacy")


def test_draft_without_weights_is_refused(tmp_path, target):
    d = make_draft(tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(CaptureSpecError, match=r"has no weight files \(\*\.safetensors\)"):
        DraftInfo.load(d)


def test_truncated_safetensors_is_refused(tmp_path, target):
    d = make_draft(tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CaptureSpecError, match=r"model.safetensors is truncated: its header describes \d+ bytes but "
                                               r"the file has \d+; download it again"):
        resolve_capture(target, d, convention="sglang-legacy")


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    d = make_draft(tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "model.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CaptureSpecError, match=r"names shard\(s\) \['model-00002-of-00002.safetensors'\]"):
        safetensors_shapes(d)


@pytest.mark.parametrize("extra", [{"target_hidden_size": 2 * H}, {"hidden_size": 2 * H}])
def test_draft_for_another_target_hidden_size_is_refused(tmp_path, target, extra):
    d = make_draft(tmp_path, extra=extra)
    with pytest.raises(CaptureSpecError, match=rf"built for a target hidden size of {2 * H} .* target's hidden size "
                                               rf"is {H}"):
        resolve_capture(target, d, convention="sglang-legacy")


@pytest.fixture
def llama_target(tmp_path):
    t = tmp_path / "llama"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": L,
                                               "hidden_size": H, "vocab_size": V}))
    return t


def test_spec_on_a_target_the_plugin_does_not_capture_is_refused(tmp_path, llama_target):
    """vLLM's own capture on a Llama target reads ids [-1, 2, 30] as its own taps: the sglang-legacy reading
    [embed, 3, 31] would be silently ignored."""
    with pytest.raises(CaptureSpecError, match=r"LlamaForCausalLM keeps vLLM's own capture .* not the spec's "
                                               r"\[embed, 3, 31\]; the capture spec would be silently ignored"):
        resolve_capture(llama_target, make_draft(tmp_path), convention="sglang-legacy")


def test_spec_that_vllm_captures_natively_is_accepted_on_any_target(tmp_path, llama_target):
    r = resolve_capture(llama_target, make_draft(tmp_path, ids=(0, 3, 31)), convention="vllm")
    assert r.spec.taps == (0, 3, 31)


@pytest.mark.parametrize("record, ok", [("[embed, 3, 31]", True), ("[3, 31, embed]", False), ("[embed, 4, 31]", False)])
def test_the_trainers_record_of_taps_is_checked(tmp_path, target, record, ok):
    """Guards issue 11: the trainer writes `vllm_eagle3.taps` into the draft config and nothing read it; a config
    whose ids are consistently wrong (or a spec in another order) passed every other check."""
    d = make_draft(tmp_path, extra={"vllm_eagle3": {"taps": record, "ids_convention": "sglang-legacy"}})
    if ok:
        assert resolve_capture(target, d, convention="sglang-legacy").spec.taps == (0, 3, 31)
    else:
        with pytest.raises(CaptureSpecError, match=rf"trained on taps {re.escape(record)} .* resolves to "
                                                   r"\[embed, 3, 31\]"):
            resolve_capture(target, d, convention="sglang-legacy")


def test_a_malformed_record_is_an_error(tmp_path, target):
    d = make_draft(tmp_path, extra={"vllm_eagle3": {"taps": [0, 3, 31]}})
    with pytest.raises(CaptureSpecError, match=r"vllm_eagle3.taps must be a label"):
        resolve_capture(target, d, convention="sglang-legacy")
