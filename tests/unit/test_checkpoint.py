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
    with pytest.raises(
        CaptureSpecError,
        match=r"only pickle weights \(pytorch_model.bin\).*safetensors only.*"
        r"save_file",
    ):
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
    with pytest.raises(
        CaptureSpecError,
        match=r"model.safetensors is truncated: its header describes \d+ bytes but "
        r"the file has \d+; download it again",
    ):
        resolve_capture(target, d, convention="sglang-legacy")


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    d = make_draft(tmp_path)
    (d / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"fc.weight": "model.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}
        )
    )
    with pytest.raises(CaptureSpecError, match=r"names shard\(s\) \['model-00002-of-00002.safetensors'\]"):
        safetensors_shapes(d)


@pytest.mark.parametrize("extra", [{"target_hidden_size": 2 * H}, {"hidden_size": 2 * H}])
def test_draft_for_another_target_hidden_size_is_refused(tmp_path, target, extra):
    d = make_draft(tmp_path, extra=extra)
    with pytest.raises(
        CaptureSpecError,
        match=rf"built for a target hidden size of {2 * H} .* target's hidden size "
        rf"is {H}",
    ):
        resolve_capture(target, d, convention="sglang-legacy")


@pytest.fixture
def llama_target(tmp_path):
    t = tmp_path / "llama"
    t.mkdir()
    (t / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": L, "hidden_size": H, "vocab_size": V})
    )
    return t


def test_spec_on_a_target_the_plugin_does_not_capture_is_refused(tmp_path, llama_target):
    """vLLM's own capture on a Llama target reads ids [-1, 2, 30] as its own taps: the sglang-legacy reading
    [embed, 3, 31] would be silently ignored."""
    with pytest.raises(
        CaptureSpecError,
        match=r"LlamaForCausalLM keeps vLLM's own capture .* not the spec's "
        r"\[embed, 3, 31\]; the capture spec would be silently ignored",
    ):
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
        with pytest.raises(
            CaptureSpecError,
            match=rf"trained on taps {re.escape(record)} .* resolves to "
            r"\[embed, 3, 31\]",
        ):
            resolve_capture(target, d, convention="sglang-legacy")


def test_a_malformed_record_is_an_error(tmp_path, target):
    d = make_draft(tmp_path, extra={"vllm_eagle3": {"taps": [0, 3, 31]}})
    with pytest.raises(CaptureSpecError, match=r"vllm_eagle3.taps must be a label"):
        resolve_capture(target, d, convention="sglang-legacy")


# ------------------------------------------------------------------ EAGLE-3.1 options and fan-in, per engine

from vllm_eagle3.checkpoint import draft_option_warnings, draft_readings  # noqa: E402

MLA = {
    "architectures": ["Eagle3DeepseekV2ForCausalLM"],
    "model_type": "kimi_k2",
    "kv_lora_rank": 512,
    "num_hidden_layers": 1,
}
LLAMA = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1}
IDS = "eagle_aux_hidden_state_layer_ids"


def readings(cfg):
    return {r.engine: r for r in draft_readings(cfg)}


def test_engine_defaults_when_nothing_is_set():
    """No flag set: every class runs plain EAGLE-3 (all options off) and sizes fc from the nested list, else 3."""
    for base in (MLA, LLAMA):
        for r in draft_readings(base):
            assert not any(r.options.values()) and r.ignored == () and r.num_taps == 3
        r = readings({**base, "eagle_config": {IDS: [0, 3, 31, 59]}})
        assert {e: x.num_taps for e, x in r.items()} == {"vLLM 0.32": 4, "SGLang 0.5.23": 4}


def test_fan_in_sources_differ_between_engines():
    """vLLM 0.32 (both classes) and SGLang's Llama draft: num_aux_hidden_states > nested list > 3; SGLang 0.5.23's MLA
    draft (kimi_k25_eagle3.py _get_eagle_aux_layer_count): nested list > top-level list > 3, num_aux_hidden_states never
    read."""
    r = readings({**MLA, IDS: [0, 3, 31, 59]})
    assert (r["vLLM 0.32"].num_taps, r["SGLang 0.5.23"].num_taps) == (3, 4)
    assert "the default 3" in r["vLLM 0.32"].num_taps_from and r["SGLang 0.5.23"].num_taps_from == "the top-level list"
    r = readings({**MLA, "num_aux_hidden_states": 4, "eagle_config": {IDS: [0, 3, 31]}})
    assert (r["vLLM 0.32"].num_taps, r["SGLang 0.5.23"].num_taps) == (4, 3)
    codes = [
        c for c, _ in draft_option_warnings({**MLA, "num_aux_hidden_states": 4, "eagle_config": {IDS: [0, 3, 31]}})
    ]
    assert codes == ["fan-in-engines"]
    r = readings({**LLAMA, "num_aux_hidden_states": 4, "eagle_config": {IDS: [0, 3, 31]}})
    assert (r["vLLM 0.32"].num_taps, r["SGLang 0.5.23"].num_taps) == (4, 4)


@pytest.mark.parametrize(
    "base, cfg, engine, opt, how",
    [
        # MLA: vLLM DeepseekV2Eagle3DecoderLayer reads norm_before_residual; SGLang Eagle3MLADecoderLayer always norms
        # after the residual.
        (MLA, {"norm_before_residual": True}, "SGLang 0.5.23", "norm_before_residual", "never reads it"),
        # MLA: neither class has an input_norm over the concatenation.
        (MLA, {"norm_before_fc": True}, "vLLM 0.32", "norm_before_fc", "never reads it"),
        (MLA, {"norm_before_fc": True}, "SGLang 0.5.23", "norm_before_fc", "never reads it"),
        # SGLang's legacy name for fc_norm (Eagle3MLAModel.__init__, LlamaModel.__init__); vLLM reads only fc_norm.
        (MLA, {"use_aux_norm": True}, "vLLM 0.32", "use_aux_norm", "never reads it"),
        (LLAMA, {"use_aux_norm": True}, "vLLM 0.32", "use_aux_norm", "never reads it"),
        # Llama: SGLang 0.5.23 LlamaDecoderLayer.forward always norms after the residual.
        (LLAMA, {"norm_before_residual": True}, "SGLang 0.5.23", "norm_before_residual", "never reads it"),
        # fc_norm / norm_output are read only at the top level; inside eagle_config every engine ignores them.
        (MLA, {"eagle_config": {"fc_norm": True}}, "vLLM 0.32", "fc_norm", "reads it only at the top level"),
        (
            LLAMA,
            {"eagle_config": {"norm_output": True}},
            "SGLang 0.5.23",
            "norm_output",
            "reads it only at the top level",
        ),
    ],
)
def test_option_an_engine_ignores_is_a_warning_naming_it(base, cfg, engine, opt, how):
    r = readings({**base, **cfg})[engine]
    assert opt in r.ignored
    messages = [m for c, m in draft_option_warnings({**base, **cfg}) if c == "option-ignored"]
    assert any(
        m.startswith(f"draft option {opt} is set") and f"but {engine} {how} ({engine} " in m for m in messages
    ), messages


def test_options_both_engines_read_give_no_warning():
    """The published EAGLE-3.1 MLA heads' flags (fc_norm + norm_output, top level) are read by vLLM 0.32 and
    SGLang 0.5.23 alike; norm_before_fc in eagle_config is read by both Llama classes (eagle_config first)."""
    cfg = {**MLA, "fc_norm": True, "norm_output": True}
    assert draft_option_warnings(cfg) == []
    assert all(r.options["fc_norm"] and r.options["norm_output"] for r in draft_readings(cfg))
    cfg = {**LLAMA, "norm_before_fc": False, "eagle_config": {"norm_before_fc": True}}
    assert draft_option_warnings(cfg) == [] and all(r.options["norm_before_fc"] for r in draft_readings(cfg))


@pytest.mark.parametrize(
    "cfg, code, text",
    [
        (
            {**MLA, "architectures": ["Eagle3DeepseekV3ForCausalLM"]},
            "mla-arch",
            "SGLang 0.5.23 has no such draft class",
        ),
        ({**MLA, "model_type": "llama"}, "mla-model-type", "vLLM 0.32 treats it as MLA only for model_type"),
        ({**MLA, "kv_lora_rank": None}, "mla-model-type", "with kv_lora_rank set"),
        ({**MLA, "num_hidden_layers": 2}, "mla-layers", "SGLang 0.5.23 refuses it"),
        ({**LLAMA, "fc_norm": True, "norm_before_fc": True}, "norm-exclusive", "apply both"),
    ],
)
def test_mla_and_norm_traps(cfg, code, text):
    found = dict(draft_option_warnings(cfg))
    assert code in found and text in found[code], found


def test_config_only_load(tmp_path):
    """A published head's config.json without weights loads for the static checks when asked to, and only then."""
    d = tmp_path / "head"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**MLA, "eagle_config": {IDS: [1, 29, 57]}}))
    with pytest.raises(CaptureSpecError, match="has no weight files"):
        DraftInfo.load(d)
    info = DraftInfo.load(d, weights=False)
    assert info.shapes == {} and info.nested_ids == (1, 29, 57) and info.fc_in_features is None


@pytest.mark.parametrize("value", ["4", 0, -1, True, 2.5])
def test_bad_num_aux_is_one_clear_error(tmp_path, target, value):
    """num_aux_hidden_states sizes vLLM's fc: a value that is not a positive int is refused, never guessed."""
    d = make_draft(tmp_path, extra={"num_aux_hidden_states": value})
    with pytest.raises(CaptureSpecError, match=r"num_aux_hidden_states must be a positive integer .* got "):
        resolve_capture(target, d, convention="sglang-legacy")
    from vllm_eagle3.tools import inspect

    rep = inspect.inspect_pair(target, d, convention="sglang-legacy")
    assert any("num_aux_hidden_states must be a positive integer" in e for e in rep.errors)
    assert "ERROR: draft: draft config num_aux_hidden_states" in inspect.render(rep)
