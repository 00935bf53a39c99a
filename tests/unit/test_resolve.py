"""Static resolution of target + draft + spec, with every class of bad input the brief names.

Each case guards a silent failure seen in the field: unknown convention, out-of-range or duplicate taps, fan-in
mismatch with the draft's fc, missing d2t (vLLM then maps draft token i to target token i), ids only in the nested
eagle_config (vLLM's runner ignores them and uses its defaults), no ids at all (defaults = the incident's wiring).
"""

import json
from pathlib import Path

import pytest
import yaml

from vllm_eagle3.testing.files import write_safetensors_zeros

from vllm_eagle3.resolve import (
    CONFIG_KEY,
    ENV_CONVENTION,
    ENV_SPEC,
    load_spec_file,
    resolve_capture,
    resolve_from_env,
    spec_file_from_mapping,
    spec_source,
)
from vllm_eagle3.spec import CaptureSpecError

pytestmark = pytest.mark.unit
H, L, V = 128, 61, 4096


def make_draft(tmp_path, ids=(-1, 2, 30), nested=True, top=True, fan_in=3 * H, d2t=True, extra=None, name="draft"):
    d = tmp_path / name
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": H,
        "draft_vocab_size": 1024,
        "vocab_size": V,
        **(extra or {}),
    }
    if top:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(ids)
    if nested:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}
    (d / "config.json").write_text(json.dumps(cfg))
    shapes = {"fc.weight": [H, fan_in], "lm_head.weight": [1024, H]}
    if d2t:
        shapes["d2t"] = [1024]
    write_safetensors_zeros(d / "model.safetensors", shapes)
    return d


@pytest.fixture
def spec_yaml(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text("taps: [embed, 3, 31]\nnum_layers: 61\ndraft_ids_convention: sglang-legacy\n")
    return p


def test_incident_head_resolves_from_yaml(target, tmp_path, spec_yaml):
    r = resolve_capture(target, make_draft(tmp_path), spec_path=spec_yaml)
    assert r.spec.taps == (0, 3, 31) and r.runner_ids == (-1, 2, 30) and r.draft_convention == "sglang-legacy"
    line = r.log_line()
    assert "taps [embed, 3, 31]" in line and str(spec_yaml) in line and "[-1, 2, 30]" in line


def test_incident_head_resolves_from_convention(target, tmp_path):
    r = resolve_capture(target, make_draft(tmp_path), convention="sglang-legacy")
    assert r.spec.taps == (0, 3, 31)
    assert "read as sglang-legacy" in r.spec.source


def test_env_is_read(target, tmp_path, spec_yaml):
    draft = make_draft(tmp_path)
    assert resolve_from_env(target, draft, {ENV_SPEC: str(spec_yaml)}).spec.taps == (0, 3, 31)
    assert resolve_from_env(target, draft, {ENV_CONVENTION: "sglang-legacy"}).spec.taps == (0, 3, 31)


def test_runner_ids_must_match(target, tmp_path, spec_yaml):
    r = resolve_capture(target, make_draft(tmp_path), spec_path=spec_yaml)
    r.check_runner_ids((2, 30, -1))
    with pytest.raises(CaptureSpecError, match=r"runner asked to capture ids \[2, 30, 58\] .* refusing"):
        r.check_runner_ids((2, 30, 58))


@pytest.mark.parametrize(
    "kwargs, setup, message",
    [
        ({}, {}, r"have no stated convention, and they mean different taps in different engines; pass --capture-spec"),
        ({"convention": "tensorrt"}, {}, r"unknown id convention 'tensorrt'"),
        ({"convention": "vllm"}, {}, r"id -1 is out of range for a 61-layer model under the vllm convention"),
        ({"convention": "sglang-legacy"}, {"ids": (2, 30, 58)}, None),  # fine on its own: taps 3/31/59
        ({"convention": "sglang-legacy"}, {"ids": (-1, 2, 2)}, r"lists id 2 twice"),
        ({"convention": "sglang-legacy"}, {"fan_in": 2 * H}, r"fan-in mismatch: the draft's fc takes 256 inputs"),
        ({"convention": "sglang-legacy"}, {"d2t": False}, r"reduced vocabulary \(1024 of 4096 tokens\) but has no d2t"),
        (
            {"convention": "sglang-legacy"},
            {"top": False},
            r"ids only in eagle_config.* V2 runner .* reads only the top-level",
        ),
        (
            {"convention": "sglang-legacy"},
            {"top": False, "nested": False},
            r"no eagle_aux_hidden_state_layer_ids; .*"
            r"defaults \[2, 30, 58\]",
        ),
        ({"convention": "sglang-legacy"}, {"ids": ([-1, 2, 30],)}, r"is a nested list"),
        ({"convention": "sglang-legacy"}, {"extra": {"num_aux_hidden_states": 2}}, r"num_aux_hidden_states = 2"),
    ],
)
def test_bad_input_is_a_clear_error(target, tmp_path, kwargs, setup, message):
    draft = make_draft(tmp_path, **setup)
    if message is None:
        assert resolve_capture(target, draft, **kwargs).spec.taps == (3, 31, 59)
        return
    with pytest.raises(CaptureSpecError, match=message):
        resolve_capture(target, draft, **kwargs)


def test_spec_and_draft_disagree(target, tmp_path, spec_yaml):
    """The incident: a spec for [embed, 3, 31] and a draft config whose ids name 3/31/59."""
    draft = make_draft(tmp_path, ids=(2, 30, 58))
    with pytest.raises(
        CaptureSpecError,
        match=r"spec \[embed, 3, 31\] .* disagree: its ids \[2, 30, 58\] read as "
        r"sglang-legacy are taps \[3, 31, 59\]",
    ):
        resolve_capture(target, draft, spec_path=spec_yaml)


def test_nested_and_top_level_disagree(target, tmp_path):
    draft = make_draft(tmp_path, nested=False)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CaptureSpecError,
        match=r"two different id lists: top-level \[-1, 2, 30\] .* eagle_config "
        r"\[2, 30, 58\]",
    ):
        resolve_capture(target, draft, convention="sglang-legacy")


def test_yaml_without_convention_cannot_be_checked(target, tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("taps: [embed, 3, 31]\n")
    with pytest.raises(CaptureSpecError, match=r"does not say how to read the draft config's ids \[-1, 2, 30\]"):
        resolve_capture(target, make_draft(tmp_path), spec_path=p)


def test_missing_and_malformed_files(target, tmp_path):
    with pytest.raises(CaptureSpecError, match="does not exist or is not a folder"):
        resolve_capture(target, tmp_path / "nope", convention="vllm")
    draft = make_draft(tmp_path)
    (draft / "config.json").write_text("{not json")
    with pytest.raises(CaptureSpecError, match="draft config .* is not valid JSON"):
        resolve_capture(target, draft, convention="vllm")
    draft2 = make_draft(tmp_path, name="draft2")
    (draft2 / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(CaptureSpecError, match="truncated"):
        resolve_capture(target, draft2, convention="sglang-legacy")


# ------------------------------------------------------------------------------ more than three taps (issue 15)


def test_four_taps_resolve_where_vllm_can_express_them(target, tmp_path):
    """[embed, 3, 31, 59] on vLLM: ids [0, 3, 31, 59] (any count; fc sized num_aux x hidden in vLLM 0.32's
    llama_eagle3.py L210-221), accepted with the fan-in the head was built for."""
    spec = tmp_path / "four.yaml"
    spec.write_text("taps: [embed, 3, 31, 59]\nnum_layers: 61\ndraft_ids_convention: vllm\n")
    d = make_draft(tmp_path, ids=(0, 3, 31, 59), fan_in=4 * H, extra={"num_aux_hidden_states": 4})
    r = resolve_capture(target, d, spec_path=spec)
    assert r.spec.taps == (0, 3, 31, 59) and r.runner_ids == (0, 3, 31, 59) and r.warnings == ()
    assert "fan-in 512" in r.log_line()
    d2 = make_draft(tmp_path, ids=(-1, 2, 30, 58), fan_in=4 * H, name="legacy")  # nested list sizes fc: 4
    assert resolve_capture(target, d2, convention="sglang-legacy").spec.taps == (0, 3, 31, 59)


def test_four_taps_refused_when_vllm_would_size_fc_for_three(target, tmp_path):
    """Ids only at the top level and no num_aux_hidden_states: vLLM 0.32 never counts the top-level list and builds
    fc for 3 taps (llama_eagle3.py L213-216); the 4-tap head would fail to load, so resolve says what to add."""
    d = make_draft(tmp_path, ids=(0, 3, 31, 59), nested=False, fan_in=4 * H)
    with pytest.raises(
        CaptureSpecError,
        match=r"^vLLM 0.32 llama_eagle3.py .* sizes the draft's fc for 3 taps \(from "
        r"the default 3.*\) but the spec \[embed, 3, 31, 59\] has 4; add "
        r"\"num_aux_hidden_states\": 4",
    ):
        resolve_capture(target, d, convention="vllm")


def test_resolution_carries_option_warnings(target, tmp_path):
    """An EAGLE-3.1 option one engine ignores is not an error for vLLM (which reads it) but is reported."""
    d = make_draft(tmp_path, extra={"use_aux_norm": True})
    r = resolve_capture(target, d, convention="sglang-legacy")
    assert (
        len(r.warnings) == 1
        and r.warnings[0].startswith("draft option use_aux_norm is set")
        and "vLLM 0.32 never reads it" in r.warnings[0]
    )


# ----------------------------------------------------------------------------------------------- the spec's channel

SHIPPED_SPEC = Path(__file__).resolve().parents[2] / "configs" / "kimi_k25_eagle3.yaml"


def additional(spec=None, **mine):
    """vLLM's additional config carrying this plugin's mapping (``spec``: a capture-spec mapping)."""
    return {"other_plugin": {"x": 1}, CONFIG_KEY: {**({"capture_spec": spec} if spec is not None else {}), **mine}}


def test_spec_mapping_validates_as_the_yaml_does():
    """The config channel must accept exactly what a capture-spec YAML holds: a second validator would let a spec
    pass one channel and fail the other (or capture other taps)."""
    data = yaml.safe_load(SHIPPED_SPEC.read_text())
    from_file, from_mapping = load_spec_file(SHIPPED_SPEC), spec_file_from_mapping(data, "here")
    assert from_mapping.spec.taps == from_file.spec.taps == (0, 3, 31)
    assert (from_mapping.num_layers, from_mapping.draft_ids_convention) == (61, "sglang-legacy")
    with pytest.raises(CaptureSpecError, match=r"capture spec here: unknown key\(s\) \['tap'\]; known keys: taps"):
        spec_file_from_mapping({"tap": ["embed"]}, "here")


def test_config_spec_wins_over_the_environment(target, tmp_path, spec_yaml):
    """Precedence stated once: the spec inside vLLM's config (the one every worker and node receives) beats the
    env var, which is only the fallback; the taps line names where the spec came from."""
    other = tmp_path / "other.yaml"
    other.write_text("taps: [3, 31, 59]\ndraft_ids_convention: sglang-legacy\n")
    env = {ENV_SPEC: str(other)}
    src = spec_source(additional({"taps": ["embed", 3, 31], "draft_ids_convention": "sglang-legacy"}), env)
    assert src.origin == "--additional-config" and src.spec_file.spec.taps == (0, 3, 31)
    r = resolve_from_env(target, make_draft(tmp_path), env, config=additional(yaml.safe_load(spec_yaml.read_text())))
    assert (
        r.spec.taps == (0, 3, 31)
        and "capturing taps [embed, 3, 31] (spec from --additional-config; $EAGLE3_SPEC ignored)" in r.log_line()
    )
    assert spec_source(additional(convention="vllm"), env).convention == "vllm"  # the config's no-spec case wins too
    fallback = spec_source({"other_plugin": {}}, {ENV_SPEC: str(spec_yaml)})
    assert fallback.origin == "$EAGLE3_SPEC" and fallback.spec_file.spec.taps == (0, 3, 31)
    assert (
        "(spec from $EAGLE3_SPEC)"
        in resolve_from_env(target, make_draft(tmp_path, name="d2"), {ENV_SPEC: str(spec_yaml)}).log_line()
    )
    assert spec_source(None, {ENV_CONVENTION: "vllm"}).origin == "$EAGLE3_CONVENTION"
    assert spec_source(None, {}).origin == "none"
    # Runtime options alone (live k off) say nothing of the spec: the env var's spec still applies, not "none".
    options_only = spec_source({CONFIG_KEY: {"live_k": False}}, {ENV_SPEC: str(spec_yaml)})
    assert options_only.origin == "$EAGLE3_SPEC" and options_only.spec_file.spec.taps == (0, 3, 31)


def test_unknown_plugin_config_key_is_refused():
    """A misspelt key (``capture-spec``) would otherwise be ignored and the server would fall back to the env var or
    refuse for lack of a convention, far from the typo."""
    with pytest.raises(
        CaptureSpecError,
        match=r"unknown key\(s\) \['capture-spec'\]; allowed keys: capture_spec: .*"
        r"convention: ",
    ):
        spec_source({CONFIG_KEY: {"capture-spec": {"taps": ["embed"]}}}, {})
    with pytest.raises(CaptureSpecError, match="must be a mapping"):
        spec_source({CONFIG_KEY: ["embed", 3, 31]}, {})
    with pytest.raises(CaptureSpecError, match=r"--additional-config vllm_eagle3.capture_spec: unknown key"):
        spec_source(additional({"taps": ["embed"], "layers": 3}), {})


def test_real_vllm_config_carries_the_spec():
    """The worker reads the spec from vLLM's own ``VllmConfig.additional_config`` (what every process receives), here
    the shipped serve YAML's ``additional-config`` mapping (tests/unit/test_serve_args.py checks that vLLM's parser
    turns the YAML into exactly this mapping)."""
    from vllm.config import VllmConfig

    shipped = Path(__file__).resolve().parents[2] / "configs" / "serve_kimi_k25_mini.yaml"
    cfg = VllmConfig(additional_config=yaml.safe_load(shipped.read_text())["additional-config"])
    src = spec_source(cfg, {ENV_SPEC: "/nonexistent.yaml"})
    assert src.origin == "--additional-config" and src.spec_file.spec.taps == (0, 3, 31)
    assert src.spec_file.draft_ids_convention == "sglang-legacy" and src.spec_file.num_layers == 61


def test_worker_resolves_the_spec_from_a_real_engine_config(monkeypatch):
    """What every worker runs (``capture.resolve_in_worker``, the check's ``online.plan.check_config_from_env``) on the
    ``VllmConfig`` vLLM builds from ``--additional-config``, with no env var: the spec's taps, the source named in the
    taps line, and the spec's ``check:`` mapping (here: off)."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_eagle3.capture import resolve_in_worker
    from vllm_eagle3.online.plan import check_config_from_env

    repo = Path(__file__).resolve().parents[2]
    for name in ("EAGLE3_SPEC", "EAGLE3_CONVENTION", "VLLM_EAGLE3_SPEC", "VLLM_EAGLE3_CONVENTION"):
        monkeypatch.delenv(name, raising=False)
    spec = {**yaml.safe_load((repo / "configs" / "kimi_k25_eagle3.yaml").read_text()), "check": {"enabled": False}}
    cfg = EngineArgs(
        model=str(repo / "models" / "kimi-k25-mini"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        additional_config={CONFIG_KEY: {"capture_spec": spec}},
        speculative_config={
            "method": "eagle3",
            "num_speculative_tokens": 2,
            "model": str(repo / "models" / "kimi-k25-mini-eagle3"),
        },
    ).create_engine_config()
    res = resolve_in_worker(cfg)
    assert res.spec.taps == (0, 3, 31) and res.runner_ids == (-1, 2, 30)
    assert "capturing taps [embed, 3, 31] (spec from --additional-config)" in res.log_line()
    assert check_config_from_env(config=cfg).enabled is False and check_config_from_env().enabled is True
