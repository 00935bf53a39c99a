"""The capture spec and the engine id conventions (no engine).

Guards the incident's root cause: layer ids mean different taps in different engines, and nothing checked.
Each row of docs/conventions.md is pinned here; SGLang's real code pins the same rows in tests/parity.
"""

import pytest

from vllm_eagle3.conventions import (
    CONVENTIONS,
    convert_ids,
    engine_default_ids,
    engine_order,
    get_convention,
    ids_to_taps,
    taps_to_ids,
)
from vllm_eagle3.resolve import load_spec_file, load_spec_yaml
from vllm_eagle3.spec import EMBED, CaptureSpec, CaptureSpecError

pytestmark = pytest.mark.unit
L = 61  # Kimi K2.5


# ---------------------------------------------------------------------------------------------------- spec


def test_spec_parses_embed_and_keeps_declared_order():
    """The declared order is the draft's fc order; nothing may sort it (vLLM's mixin does)."""
    spec = CaptureSpec(taps=("embed", 31, 3))
    assert spec.taps == (0, 31, 3)
    assert spec.label() == "[embed, 31, 3]"
    assert spec.has_embed and spec.num_taps == 3


@pytest.mark.parametrize(
    "taps, message",
    [
        ([], "has no taps"),
        ([0, 3, 3], "tap 3 appears twice"),
        (["embed", 0, 3], "tap embed appears twice"),
        ([-1, 2, 30], "SGLang-legacy's embedding id"),
        (["layer3"], "is not understood"),
        ([[0, 3, 31]], "nested list"),
        ([True], "boolean"),
        ("embed,3,31", "must be a list"),
    ],
)
def test_spec_rejects_bad_taps(taps, message):
    with pytest.raises(CaptureSpecError, match=message):
        CaptureSpec(taps=taps)


def test_spec_out_of_range_names_valid_range_and_neighbour():
    with pytest.raises(CaptureSpecError) as e:
        CaptureSpec(taps=(0, 3, 62)).check_num_layers(L)
    assert "tap 62 is out of range for a 61-layer model (valid: embed, 0..61)" in str(e.value)
    assert "did you mean tap 61" in str(e.value)
    CaptureSpec(taps=(0, 3, 61)).check_num_layers(L)  # the final pre-norm state is a valid tap


def test_fan_in_mismatch_says_how_many_taps_the_draft_expects():
    spec = CaptureSpec(taps=(0, 3))
    with pytest.raises(
        CaptureSpecError,
        match=r"fc takes 384 inputs but the spec \[embed, 3\] gives 2 x 128 = 256 "
        r"\(the draft was trained on 3 taps\)",
    ):
        spec.check_fan_in(384, 128)
    CaptureSpec(taps=(0, 3, 31)).check_fan_in(384, 128)


def test_spec_yaml_roundtrip_and_unknown_keys(tmp_path):
    good = tmp_path / "s.yaml"
    good.write_text("taps: [embed, 3, 31]\nnum_layers: 61\ndraft_ids_convention: sglang-old\n")
    sf = load_spec_file(good)
    assert sf.spec.taps == (0, 3, 31) and sf.num_layers == 61 and sf.draft_ids_convention == "sglang-legacy"
    assert sf.spec.source == str(good)

    bad = tmp_path / "bad.yaml"
    bad.write_text("taps: [embed, 3, 31]\nlayers: [1]\n")
    with pytest.raises(CaptureSpecError, match=r"unknown key\(s\) \['layers'\]; known keys: taps"):
        load_spec_yaml(bad)
    bad.write_text("taps: [embed, 3, 31]\ndraft_ids_convention: tensorrt\n")
    with pytest.raises(CaptureSpecError, match="unknown id convention 'tensorrt'; known: vllm"):
        load_spec_yaml(bad)
    bad.write_text("taps: [embed, 3, 62]\nnum_layers: 61\n")
    with pytest.raises(CaptureSpecError, match="tap 62 is out of range"):
        load_spec_yaml(bad)
    bad.write_text("taps: [embed, 3\n")
    with pytest.raises(CaptureSpecError, match="not valid YAML"):
        load_spec_yaml(bad)
    with pytest.raises(CaptureSpecError, match="does not exist"):
        load_spec_yaml(tmp_path / "missing.yaml")


def test_shipped_spec_is_the_incident_head():
    from pathlib import Path

    sf = load_spec_file(Path(__file__).parents[2] / "configs" / "kimi_k25_eagle3.yaml")
    assert sf.spec.taps == (EMBED, 3, 31) and sf.num_layers == 61 and sf.draft_ids_convention == "sglang-legacy"


# ---------------------------------------------------------------------------------------------- conventions

# (convention, ids written in the draft config, taps they mean on a 61-layer model) — docs/conventions.md
ROWS = [
    ("vllm", [0, 3, 31], (0, 3, 31)),
    ("speculators", [0, 3, 31], (0, 3, 31)),
    ("hf", [0, 3, 31], (0, 3, 31)),
    ("sglang", [0, 3, 31], (0, 3, 31)),  # 0.5.13+: 0 works unpatched
    ("sglang", [1, 3, 31], (2, 4, 32)),  # ...but a list starting with 1 is shifted
    ("sglang-legacy", [-1, 2, 30], (0, 3, 31)),  # the incident's fixed config
    ("sglang-legacy", [2, 30, 58], (3, 31, 59)),  # the incident's broken config
    ("sglang-legacy", [0, 3, 31], (1, 4, 32)),  # the same JSON as vLLM's, other taps
    ("specforge", [2, 30, 58], (3, 31, 59)),
    ("vllm", [2, 30, 58], (2, 30, 58)),
    ("torchspec", [1, 29, 57], (2, 30, 58)),  # lightseekorg's MLA head as trained ...
    ("vllm", [2, 30, 58], (2, 30, 58)),  # ... and as exported for vLLM (convert_to_hf.py: +1 on kimi_k2)
    ("sglang", [1, 29, 57], (2, 30, 58)),  # SGLang 0.5.23 reads the training list right (leading 1)
    ("torchspec", [2, 30, 58, 60], (3, 31, 59, 61)),  # any number of ids
]


@pytest.mark.parametrize("conv, ids, taps", ROWS)
def test_conventions_table(conv, ids, taps):
    assert ids_to_taps(ids, conv, L) == taps
    back = taps_to_ids(taps, conv, L)
    assert sorted(ids_to_taps(back, conv, L)) == sorted(taps)


@pytest.mark.parametrize("conv", sorted(CONVENTIONS))
@pytest.mark.parametrize("taps", [(0, 3, 31), (3, 31, 59), (1, 2, 3), (2, 30, 58), (31, 0, 3), (1, 30, 61)])
def test_roundtrip_every_convention(conv, taps):
    """taps -> ids -> taps is the identity (up to the engine's own ordering) or a clear refusal."""
    try:
        ids = taps_to_ids(taps, conv, L)
    except CaptureSpecError as exc:
        assert (
            (0 in taps and conv in ("specforge", "torchspec") and "cannot express the embedding tap" in str(exc))
            or (61 in taps and conv == "specforge" and "out of range" in str(exc))
            or (61 in taps and conv in ("sglang", "sglang-legacy") and "cannot capture tap 61" in str(exc))
        ), str(exc)
        return
    assert sorted(ids_to_taps(ids, conv, L)) == sorted(taps)
    if get_convention(conv).concat_order == "listed" or conv in ("vllm", "speculators", "sglang-legacy"):
        assert ids_to_taps(ids, conv, L) == tuple(taps)


def test_same_json_means_different_taps_across_engines():
    """The incident: the JSON alone does not say which taps it names."""
    meanings = {c: ids_to_taps([0, 3, 31], c, L) for c in ("vllm", "sglang", "sglang-legacy")}
    assert meanings == {"vllm": (0, 3, 31), "sglang": (0, 3, 31), "sglang-legacy": (1, 4, 32)}


def test_convert_incident_config():
    assert convert_ids([-1, 2, 30], "sglang-legacy", "vllm", L) == (0, 3, 31)
    assert convert_ids([0, 3, 31], "vllm", "sglang-legacy", L) == (-1, 2, 30)
    with pytest.raises(CaptureSpecError, match="specforge cannot express the embedding tap"):
        convert_ids([-1, 2, 30], "sglang-legacy", "specforge", L)


@pytest.mark.parametrize(
    "conv, ids, message",
    [
        (
            "vllm",
            [-1, 2, 30],
            r"id -1 is out of range .* vllm convention \(valid: 0..61\); -1 means the embedding only",
        ),
        ("sglang", [-1, 2, 30], r"id -1 is out of range"),
        ("sglang-legacy", [2, 30, 61], r"id 61 is out of range .* \(valid: -1..60\)"),
        ("specforge", [-1, 2, 30], r"specforge cannot express the embedding tap"),
        ("specforge", [2, 30], r"requires exactly 3 ids, got 2 \(SpecForge's resolve_eagle_capture_layers"),
        ("torchspec", [-1, 2, 30], r"torchspec cannot express the embedding tap"),
        ("torchspec", [1, 29, 61], r"id 61 is out of range .* torchspec convention \(valid: 0..60\)"),
        ("sglang", [0, 3, 61], r"id 61 is out of range .* sglang convention \(valid: 0..60\)"),
        ("sglang", [1, 29, 60], r"sglang cannot capture tap 61 .*captured n-1 of n aux hidden states"),
        ("vllm", [3, 3, 31], r"lists id 3 twice"),
        ("vllm", [[0, 3, 31]], r"is nested; a runner reads a flat list"),
        ("vllm", ["3"], r"not an integer"),
        ("vllm", [], r"is empty"),
        ("tensorrt", [0], r"unknown id convention 'tensorrt'; known: vllm, speculators, hf, sglang, sglang-legacy"),
    ],
)
def test_bad_ids(conv, ids, message):
    with pytest.raises(CaptureSpecError, match=message):
        ids_to_taps(ids, conv, L)


def test_engine_defaults_and_order():
    assert engine_default_ids(L) == (2, 30, 58)
    assert engine_order((31, 0, 3), "vllm") == (0, 3, 31)
    assert engine_order((31, 0, 3), "specforge") == (31, 0, 3)


def test_sglang_leading_one_is_rewritten_not_shifted():
    """SGLang 0.5.13+ shifts a list whose first id is 1; taps (1, 3, 31) must therefore be listed another way."""
    ids = taps_to_ids((1, 3, 31), "sglang", L)
    assert ids[0] != 1 and sorted(ids_to_taps(ids, "sglang", L)) == [1, 3, 31]


# ------------------------------------------------------------------------------------- more than three taps

FOUR = (EMBED, 3, 31, 59)


def test_four_taps_per_convention():
    """Issue 15 item 5: [embed, 3, 31, 59] in every convention, or the engine's own reason it cannot be written.

    Checked against the real sources: vLLM 0.32 passes any list through (fc sized num_aux x hidden); SGLang 0.5.23's
    DeepSeek path keeps any list (deepseek_v2.py L3473) in a packer sized len(list); SpecForge raises unless exactly
    three (model_providers.py L206); TorchSpec takes any count but has no embedding id; SGLang 0.5.12.post1 serves
    three only (eagle_info.py L877-901)."""
    assert taps_to_ids(FOUR, "vllm", L) == (0, 3, 31, 59)
    assert taps_to_ids(FOUR, "sglang", L) == (0, 3, 31, 59)
    # SGLang 0.5.12.post1 captures four (+1 each) but sizes its draft-extend buffer from the target's config (3 x H).
    with pytest.raises(
        CaptureSpecError,
        match=r"sglang-legacy ids can name 4 taps, but that engine serves 3 only "
        r"\(SGLang 0.5.12.post1 .*eagle_info.py EagleDraftExtendInput.hidden_size_for",
    ):
        taps_to_ids(FOUR, "sglang-legacy", L)
    assert ids_to_taps((-1, 2, 30, 58), "sglang-legacy", L) == FOUR  # read (to serve on vLLM), never refused
    assert taps_to_ids(FOUR[:3], "sglang-legacy", L) == (-1, 2, 30)
    with pytest.raises(CaptureSpecError, match=r"specforge cannot express the embedding tap"):
        taps_to_ids(FOUR, "specforge", L)
    with pytest.raises(
        CaptureSpecError,
        match=r"specforge requires exactly 3 ids, got 4 \(SpecForge's "
        r"resolve_eagle_capture_layers .* TorchSpec or speculators\)",
    ):
        taps_to_ids((3, 31, 59, 60), "specforge", L)
    with pytest.raises(CaptureSpecError, match=r"torchspec cannot express the embedding tap"):
        taps_to_ids(FOUR, "torchspec", L)
    assert taps_to_ids((3, 31, 59, 61), "torchspec", L) == (2, 30, 58, 60)


def test_every_convention_names_its_source():
    """A row without a code reference is a guess; the engine table's docstring and each row carry the file and the
    function that does it (names, not line numbers: those move with every upstream commit)."""
    import vllm_eagle3.engines as mod

    for conv in CONVENTIONS.values():
        assert conv.code_ref and conv.description
    for ref in (
        "eagle3_target_model.py",
        "_fixup_export_config",
        "resolve_eagle_capture_layers",
        "set_eagle3_layers_to_capture",
    ):
        assert ref in mod.__doc__
