"""The incident's own engine: SGLang's LEGACY capture rule, run for real (SGLang 0.5.12.post1), on the miniature.

Guards the incident end to end on the code that caused it. A Kimi K2.5 EAGLE-3 head trained on
``cat([embed, layer 3, layer 31])`` was served by SGLang with draft ids ``[2, 30, 58]``; SGLang's legacy
``set_eagle3_layers_to_capture`` (``[val + 1 for val in layer_ids]``) turned them into taps 3/31/59, and the
embedding could not be tapped at all (``-1`` -> capture index 0 -> ``hidden_states + residual`` with ``residual``
None). The user patched ``deepseek_v2.py``; this project ships that as
``vllm_eagle3/model_patches/sglang_embed_tap.py``.

Which SGLang: PyPI's 0.5.13 and 0.5.13.post1 already carry the conditional rule (``if layer_ids and layer_ids[0] ==
1``, ``srt/models/deepseek_v2.py`` ``set_eagle3_layers_to_capture``); 0.5.12.post1 is the newest release with the
legacy rule, so ``.venv-sglang-legacy`` pins it (``sglang_harness/requirements-legacy.txt``, ``make
sglang-legacy-env``). Everything on the SGLang side is SGLang's own ``ModelRunner`` +
``KimiK25ForConditionalGeneration`` with the miniature's real weights (``models/kimi-k25-mini``), driven by the shared
``sglang_harness/runner.py``.

What is pinned here, each against transformers' ``output_hidden_states`` and the conventions table:
- ``[2, 30, 58]`` -> taps 3/31/59 (the incident's wiring), in ascending order whatever the listed order;
- ``[-1, 2, 30]`` unpatched -> the incident user's crash (``TypeError`` adding ``None``), patched -> taps
  embed/3/31, equal to what the vLLM plugin hands its draft for spec ``[embed, 3, 31]``;
- ``vllm-eagle3 convert`` from ``sglang-legacy`` to every other convention and back: the ids it writes for SGLang
  0.5.23 capture, on 0.5.23's real code, the tensors 0.5.12.post1 captures for the legacy ids.

Tolerances: the trained miniature's residual stream reaches values of ~2000, so taps >= 1 are compared relative to
the tap's largest value (:data:`TAP_REL` = 1e-4; float32 in every engine, absorbed-MLA vs naive attention and MoE
kernels are re-associations of the same products; measured: 1.0e-6 / 2.2e-6 / 5.7e-6 at taps 3 / 31 / 59 vs
transformers, 2.2e-6 / 7.9e-6 at taps 3 / 31 vs the vLLM plugin). The embedding is bit-identical.
Every comparison also checks the neighbouring taps are > 100x the tolerance away, so an off-by-one cannot pass.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from test_sglang_parity import assert_real_sglang_run, require_sglang_env, run_sglang, sglang_taps
from vllm_eagle3.conventions import CONVENTIONS, ids_to_taps, taps_to_ids
from vllm_eagle3.spec import EMBED, CaptureSpecError, tap_label

pytestmark = pytest.mark.parity

REPO = Path(__file__).resolve().parents[2]
MINI_TARGET = REPO / "models" / "kimi-k25-mini"  # the shipped miniature (conftest.py's engine runs it too)
LEGACY_PY = Path(os.environ.get("SGLANG_LEGACY_PYTHON", REPO / ".venv-sglang-legacy" / "bin" / "python"))
LEGACY_VERSION = "0.5.12.post1"
CURRENT_VERSION = "0.5.23"
TAP_REL = 1e-4
NUM_LAYERS = 61  # the miniature has the incident model's depth
TRAINED_TAPS = (EMBED, 3, 31)

#: name -> (legacy ids, apply vllm_eagle3/model_patches/sglang_embed_tap.py?); unpatched first
#: (the patch is process-wide).
LEGACY_CASES = {
    "incident_2_30_58": ([2, 30, 58], False),  # first: ids read by SGLang's ModelRunner itself
    "incident_listed_58_2_30": ([58, 2, 30], False),
    "sglang_ids_0_3_31": ([0, 3, 31], False),  # ids written for SGLang 0.5.13+, read by the legacy rule
    "final_state_2_30_60": ([2, 30, 60], False),  # id L-1 = tap L, the final pre-norm state
    "legacy_-1_2_30_unpatched": ([-1, 2, 30], False),
    "legacy_-1_2_30": ([-1, 2, 30], True),
    "legacy_listed_30_-1_2": ([30, -1, 2], True),
}

#: Tap sets whose legacy ids are converted to SGLang 0.5.23's ids and run there: legacy case -> taps.
CONVERTED = {"legacy_-1_2_30": TRAINED_TAPS, "incident_2_30_58": (3, 31, 59), "sglang_ids_0_3_31": (1, 4, 32)}


def require_legacy_env() -> None:
    require_sglang_env(LEGACY_PY, "sglang-legacy-env")


def assert_tap(where: str, got: torch.Tensor, states, tap: int) -> float:
    """``got`` is transformers' ``hidden_states[tap]`` (bit-exact for the embedding), not a neighbour; returns the
    relative difference (the shared check, vllm_eagle3/testing/taps.py, at this module's TAP_REL)."""
    from vllm_eagle3.testing.taps import assert_is_tap

    return assert_is_tap(got, states, tap, rel=TAP_REL, where=where)


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: the miniature in SGLang's layout, its transformers states, one SGLang process per version.


@pytest.fixture(scope="module")
def mini_sglang_dir(tiny_root) -> Path:
    import kimi_layout  # harness module, on sys.path via test_sglang_parity

    return kimi_layout.write_sglang_layout(MINI_TARGET, tiny_root / "kimi_mini_sglang_layout")


@pytest.fixture(scope="module")
def mini_hf(mini_prompt):
    from vllm_eagle3.miniature import export

    model = export.load_text_model(MINI_TARGET)
    with torch.no_grad():
        return model(input_ids=torch.tensor([mini_prompt]), output_hidden_states=True).hidden_states


@pytest.fixture(scope="module")
def legacy_drafts(make_draft) -> dict[str, Path]:
    return {name: make_draft(MINI_TARGET, ids) for name, (ids, _) in LEGACY_CASES.items()}


@pytest.fixture(scope="module")
def legacy_run(mini_sglang_dir, legacy_drafts, mini_prompt, tmp_path_factory) -> dict:
    require_legacy_env()
    cases = {name: (legacy_drafts[name], patched) for name, (_, patched) in LEGACY_CASES.items()}
    return run_sglang(
        mini_sglang_dir, cases, mini_prompt, tmp_path_factory.mktemp("sglang_legacy") / "legacy.pt", python=LEGACY_PY
    )


def convert_cli(config: Path, src: str, dst: str, out: Path) -> tuple[int, str]:
    """``vllm-eagle3 convert --from src --to dst --num-layers 61 config -o out`` (the CLI's own main)."""
    import contextlib
    import io

    from vllm_eagle3.tools import convert

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = convert.main([str(config), "--from", src, "--to", dst, "--num-layers", str(NUM_LAYERS), "-o", str(out)])
    return rc, err.getvalue()


def config_ids(config: Path) -> list[int]:
    import json

    cfg = json.loads(Path(config).read_text())
    nested = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == nested, f"{config}: top-level and nested ids differ"
    return nested


@pytest.fixture(scope="module")
def converted_drafts(legacy_drafts, tmp_path_factory) -> dict[str, Path]:
    """Each CONVERTED legacy draft rewritten by ``vllm-eagle3 convert --from sglang-legacy --to sglang``."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for name in CONVERTED:
        dst = root / name
        shutil.copytree(legacy_drafts[name], dst)
        rc, err = convert_cli(legacy_drafts[name] / "config.json", "sglang-legacy", "sglang", dst / "config.json")
        assert rc == 0, err
        out[name] = dst
    return out


@pytest.fixture(scope="module")
def current_run(mini_sglang_dir, converted_drafts, mini_prompt, tmp_path_factory) -> dict:
    """SGLang 0.5.23 on the miniature with the converted ids (no patch)."""
    cases = {name: (draft, False) for name, draft in converted_drafts.items()}
    return run_sglang(mini_sglang_dir, cases, mini_prompt, tmp_path_factory.mktemp("sglang_current") / "current.pt")


# ---------------------------------------------------------------------------------------------------------------
# SGLang 0.5.12.post1's legacy rule, unpatched.


def test_legacy_run_is_sglang_0_5_12_post1_kimi_k25_with_no_stubbed_kernel_called(legacy_run):
    """The numbers below come from SGLang 0.5.12.post1's real KimiK25 class on the miniature's weights."""
    assert_real_sglang_run(legacy_run, LEGACY_VERSION, "KimiK25ForConditionalGeneration", "incident_2_30_58")
    assert legacy_run["num_layers"] == NUM_LAYERS


def test_incident_ids_2_30_58_are_taps_3_31_59_on_legacy_sglang(legacy_run, mini_hf):
    """The incident: legacy SGLang reads [2, 30, 58] as taps 3/31/59 — not the trained cat([embed, 3, 31])."""
    case = legacy_run["cases"]["incident_2_30_58"]
    taps = ids_to_taps(case["draft_ids"], "sglang-legacy", NUM_LAYERS)
    assert taps == (3, 31, 59)
    assert case["layers_to_capture"] == list(taps), "the sglang-legacy row disagrees with SGLang 0.5.12.post1's code"
    for got, tap in zip(sglang_taps(legacy_run, "incident_2_30_58"), taps):
        assert_tap("SGLang 0.5.12.post1 (incident ids)", got, mini_hf, tap)


def test_legacy_sglang_concatenates_ascending_whatever_the_listed_order(legacy_run):
    """[58, 2, 30] captures the same three states as [2, 30, 58], concatenated in layer order (3, 31, 59): the
    capture loop appends as it walks the layers, and the logits processor concatenates that list."""
    case = legacy_run["cases"]["incident_listed_58_2_30"]
    assert case["layers_to_capture"] == [59, 3, 31]
    assert torch.equal(case["aux"], legacy_run["cases"]["incident_2_30_58"]["aux"])
    assert CONVENTIONS["sglang-legacy"].concat_order == "ascending"


def test_sglang_0_5_13_ids_mean_other_taps_on_legacy_sglang(legacy_run, mini_hf):
    """The same JSON, another wiring: [0, 3, 31] (taps embed/3/31 on SGLang 0.5.13+) is taps 1/4/32 on 0.5.12.post1."""
    case = legacy_run["cases"]["sglang_ids_0_3_31"]
    assert ids_to_taps(case["draft_ids"], "sglang", NUM_LAYERS) == TRAINED_TAPS
    taps = ids_to_taps(case["draft_ids"], "sglang-legacy", NUM_LAYERS)
    assert taps == (1, 4, 32) and case["layers_to_capture"] == list(taps)
    for got, tap in zip(sglang_taps(legacy_run, "sglang_ids_0_3_31"), taps):
        assert_tap("SGLang 0.5.12.post1 ([0, 3, 31])", got, mini_hf, tap)


def test_legacy_sglang_silently_drops_the_final_pre_norm_state(legacy_run, mini_hf):
    """Id L-1 (tap L) becomes capture index L, which the layer loop (0..L-1) never reaches: 0.5.12.post1 hands over
    two states instead of three, without an error (0.5.23 at least raises). The sglang-legacy row refuses tap L."""
    case = legacy_run["cases"]["final_state_2_30_60"]
    assert case["error"] is None and case["layers_to_capture"] == [3, 31, NUM_LAYERS]
    got = sglang_taps(legacy_run, "final_state_2_30_60")
    assert len(got) == 2, f"expected SGLang 0.5.12.post1 to drop tap {NUM_LAYERS}, got {len(got)} slices"
    for g, tap in zip(got, (3, 31)):
        assert_tap("SGLang 0.5.12.post1 ([2, 30, 60])", g, mini_hf, tap)
    with pytest.raises(CaptureSpecError, match=f"cannot capture tap {NUM_LAYERS}"):
        ids_to_taps([2, 30, 60], "sglang-legacy", NUM_LAYERS)


def test_embed_id_minus_1_crashes_unpatched_legacy_sglang_as_for_the_incident_user(legacy_run):
    """Unpatched, -1 becomes capture index 0 and the first forward adds ``residual`` (None before layer 0) to the
    embedding: the crash that made the incident's user patch ``deepseek_v2.py``."""
    case = legacy_run["cases"]["legacy_-1_2_30_unpatched"]
    assert case["legacy_patch"] is None
    assert case["layers_to_capture"] == [0, 3, 31]
    assert case["error"] == "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'", case["error"]
    assert "deepseek_v2.py" in case["traceback"] and "hidden_states + residual" in case["traceback"], case["traceback"][
        -2000:
    ]


# ---------------------------------------------------------------------------------------------------------------
# With vllm_eagle3/model_patches/sglang_embed_tap.py on SGLang 0.5.12.post1.


def test_legacy_ids_with_patch_are_taps_embed_3_31_on_legacy_sglang(legacy_run, mini_hf):
    """[-1, 2, 30] + the project's patch -> taps embed/3/31 on the incident's engine, equal to transformers."""
    case = legacy_run["cases"]["legacy_-1_2_30"]
    patch = case["legacy_patch"]
    assert patch and patch["sglang_version"] == LEGACY_VERSION
    assert patch["targets"][-1].endswith("DeepseekV2Model.forward"), patch
    taps = ids_to_taps(case["draft_ids"], "sglang-legacy", NUM_LAYERS)
    assert taps == TRAINED_TAPS and case["layers_to_capture"] == list(taps)
    got = sglang_taps(legacy_run, "legacy_-1_2_30")
    for g, tap in zip(got, taps):
        assert_tap("SGLang 0.5.12.post1 + patch", g, mini_hf, tap)
    assert torch.equal(got[0], case["embed"]), "tap embed is not the embedding SGLang's own embed_tokens computed"
    listed = legacy_run["cases"]["legacy_listed_30_-1_2"]
    assert listed["layers_to_capture"] == [31, 0, 3] and torch.equal(listed["aux"], case["aux"]), (
        "patched legacy SGLang must concatenate [30, -1, 2] in ascending order, embed first"
    )


def test_patched_legacy_sglang_feeds_the_draft_what_the_vllm_plugin_feeds_it(legacy_run, mini_vllm_draft_call, mini_hf):
    """SGLang 0.5.12.post1 + patch with [-1, 2, 30] and the vLLM plugin with spec [embed, 3, 31] hand the draft the
    same ``[T, 3 * hidden]`` input, slice by slice (embed bit-identical; 3 and 31 within TAP_REL of each other)."""
    sg = legacy_run["cases"]["legacy_-1_2_30"]["aux"]
    vl = mini_vllm_draft_call["aux"].to(torch.float32)
    assert sg.shape == vl.shape, f"SGLang legacy draft input {tuple(sg.shape)} vs vLLM plugin {tuple(vl.shape)}"
    hidden = sg.shape[-1] // len(TRAINED_TAPS)
    for tap, s, v in zip(TRAINED_TAPS, sg.split(hidden, -1), vl.split(hidden, -1)):
        rel = (s - v).abs().max().item() / v.abs().max().item()
        print(
            f"tap {tap_label(tap)}: SGLang 0.5.12.post1 + patch vs vLLM plugin, max abs diff / max |value| = {rel:.3g}"
        )
        if tap == EMBED:
            assert torch.equal(s, v), f"embed slice: SGLang legacy vs vLLM plugin differ by {rel:.3g}"
        else:
            assert rel <= TAP_REL, f"tap {tap}: SGLang legacy vs vLLM plugin relative difference {rel:.3g}"


# ---------------------------------------------------------------------------------------------------------------
# vllm-eagle3 convert, checked on both SGLang versions.


def test_convert_from_sglang_legacy_captures_the_same_tensors_on_sglang_0_5_23(
    legacy_run, current_run, converted_drafts, mini_hf
):
    """``convert --from sglang-legacy --to sglang`` writes ids with which SGLang 0.5.23 captures exactly the tensors
    0.5.12.post1 captured for the legacy ids (bit for bit) — including taps 1/4/32, where a leading 1 would trigger
    0.5.23's shift and convert lists another tap first ([4, 32, 1])."""
    assert current_run["sglang_version"] == CURRENT_VERSION
    for name, taps in CONVERTED.items():
        legacy_ids = LEGACY_CASES[name][0]
        new_ids = config_ids(converted_drafts[name] / "config.json")
        case = current_run["cases"][name]
        assert case["draft_ids"] == new_ids and case["stub_calls"] == []
        assert sorted(case["layers_to_capture"]) == sorted(taps), (
            f"{legacy_ids} (legacy) -> {new_ids} (sglang): "
            f"SGLang 0.5.23 captured {case['layers_to_capture']}, not {taps}"
        )
        old = sglang_taps(legacy_run, name)
        new = sglang_taps(current_run, name)
        for tap, o, n in zip(sorted(taps), old, new):
            assert_tap(f"SGLang 0.5.23 ({new_ids})", n, mini_hf, tap)
            # Same CPU kernels, same weights: measured bit-identical across the two releases.
            assert torch.equal(o, n), (
                f"tap {tap_label(tap)}: 0.5.23 with {new_ids} "
                f"vs 0.5.12.post1 with {legacy_ids}: "
                f"max abs diff {(o - n).abs().max().item():.3g}"
            )


@pytest.mark.parametrize("convention", [c for c in CONVENTIONS if c != "sglang-legacy"])
def test_convert_sglang_legacy_round_trips_through_every_convention(
    convention, legacy_drafts, converted_drafts, tmp_path
):
    """legacy -> ``convention`` -> back gives the legacy ids the 0.5.12.post1 run checked, and ``convention`` ->
    sglang gives the ids the 0.5.23 run checked; what ``convention`` cannot express is refused with the reason."""
    for name, taps in CONVERTED.items():
        legacy_ids = LEGACY_CASES[name][0]
        mid = tmp_path / f"{name}.{convention}.json"
        rc, err = convert_cli(legacy_drafts[name] / "config.json", "sglang-legacy", convention, mid)
        try:
            taps_to_ids(taps, convention, NUM_LAYERS)
        except CaptureSpecError as exc:  # e.g. specforge / torchspec have no id for the embedding
            assert rc == 1 and str(exc) in err and not mid.exists(), f"{convention} should refuse {taps}: {err}"
            continue
        assert rc == 0, f"convert sglang-legacy -> {convention} of {legacy_ids}: {err}"
        assert sorted(ids_to_taps(config_ids(mid), convention, NUM_LAYERS)) == sorted(taps)
        back, current = tmp_path / f"{name}.back.json", tmp_path / f"{name}.sglang.json"
        assert convert_cli(mid, convention, "sglang-legacy", back)[0] == 0
        assert convert_cli(mid, convention, "sglang", current)[0] == 0
        assert sorted(config_ids(back)) == sorted(legacy_ids), f"{convention}: {config_ids(back)} vs {legacy_ids}"
        assert config_ids(current) == config_ids(converted_drafts[name] / "config.json"), (
            f"{convention} -> sglang: {config_ids(current)}, but 0.5.23 was checked with another list"
        )
