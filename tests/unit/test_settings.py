"""The settings models (vllm_eagle3/settings.py and its subclasses) without an engine: every key declared once with
its help, and every bad value told in ONE line naming the key.

The bugs it guards: a key added to a model without a help line (the error would then say nothing of the fix); a key
allowed by a parallel table but unknown to the model, or the reverse (issue 48: four hand-made tables); pydantic's
multi-line ``ValidationError`` dump reaching a user instead of the module's own exception.
"""

from __future__ import annotations

import pytest

from vllm_eagle3.resolve import PluginConfig, SpecFile, plugin_config, spec_file_from_mapping
from vllm_eagle3.settings import Settings, field_help
from vllm_eagle3.spec import CaptureSpecError
from vllm_eagle3.watch import WatchConfig
from vllm_eagle3.wiring_check import CheckConfig

pytestmark = pytest.mark.unit

MODELS = (SpecFile, PluginConfig, CheckConfig, WatchConfig)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_key_has_its_help(model: type[Settings]):
    assert model.model_config["extra"] == "forbid" and model.model_config["frozen"]
    for name, field in model.model_fields.items():
        assert field.description, f"{model.__name__}.{name} has no description"
    assert field_help(CheckConfig, "budget").startswith("number in (0, 0.5] (default 0.02): at most this fraction")


@pytest.mark.parametrize(
    "mapping, words",
    [
        ({"taps": ["embed"], "check": {"budget": 0.9}}, "capture spec s.yaml: check.budget = 0.9 is invalid"),
        ({"taps": ["embed"], "check": {"sample_every": 2.0}}, "check.sample_every = 2.0 is invalid"),
        ({"taps": ["embed"], "watch": {"window": 64, "min_drafts": 65}}, "watch.min_drafts = 65 is invalid"),
        ({"taps": ["embed"], "watch": {"windw": 1}}, "watch: unknown key(s) ['windw']; known keys: enabled, window"),
        ({"taps": ["embed"], "watch": [1]}, "watch must be a mapping such as {enabled: true, window: 512}"),
        ({"taps": "embed"}, "capture spec s.yaml: taps = 'embed' is invalid"),
        ({"taps": ["embed"], "num_layers": True}, "num_layers = True is invalid"),
        ({}, "capture spec s.yaml: `taps` is missing"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_key(mapping, words):
    with pytest.raises(CaptureSpecError) as exc:
        spec_file_from_mapping(mapping, "s.yaml")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_direct_construction_raises_the_module_error():
    """Code building a config by hand gets the same line as a YAML does, not a ValidationError."""
    with pytest.raises(CaptureSpecError, match=r"^check\.min_requests = 2 is invalid .*int >= 8 \(default 12\)"):
        CheckConfig(min_requests=2)
    with pytest.raises(CaptureSpecError, match=r"^watch\.floor = nan is invalid"):
        WatchConfig(floor=float("nan"))
    assert WatchConfig(window=16, min_drafts=16).min_drafts == 16 and CheckConfig() == CheckConfig.from_mapping(None)


def test_plugin_config_lists_its_keys_with_their_help():
    with pytest.raises(CaptureSpecError) as exc:
        plugin_config({"vllm_eagle3": {"livek": True}})
    line = str(exc.value)
    assert "\n" not in line and line.startswith("--additional-config 'vllm_eagle3': unknown key(s) ['livek']")
    assert all(f"{key}: " in line for key in PluginConfig.model_fields)
    assert plugin_config({"vllm_eagle3": {"convention": "vllm"}}) == {"convention": "vllm"}
