"""Cross-engine parity: the taps SGLang 0.5.23's OWN DeepseekV3 / KimiK25 code captures, tensor for tensor.

Guards the incident: a Kimi K2.5 EAGLE-3 head trained on ``cat([embed, layer 3, layer 31])`` was served by SGLang
with draft ids ``[2, 30, 58]``, which SGLang's legacy ``+1`` turned into taps 3/31/59. Here the SGLang side is
SGLang itself — ``ModelRunner`` + the real model classes + real weights, in its own venv (``.venv-sglang``,
``scripts/setup_sglang_env.sh``), driven by ``sglang_harness/runner.py`` — never a re-implementation of its rules.
Every case also pins a row of :mod:`vllm_eagle3.conventions` against SGLang's real code: the taps the conventions
table predicts for a draft's ids are the capture indices SGLang actually used, and the tensors are transformers'
``output_hidden_states`` at those taps.

Tolerances (float32 in every engine, same weights, same token ids):
- ``embed`` (tap 0): bit-identical. Both engines look up the same float32 embedding rows.
- SGLang vs transformers, taps >= 1: ``atol = rtol = 1e-4`` (:data:`ATOL`). SGLang runs the absorbed MLA path
  (W_UK folded into the query, W_UV applied after attention) and its own MoE kernels: a float32 re-association of
  the same products. Measured max abs difference: ~1e-6 at tap 31 and ~2e-6 at tap 59 (values up to ~2); the
  tolerance leaves ~50x margin. It is also checked to DISCRIMINATE: neighbouring taps k-1 / k+1 differ by far more
  than it (:func:`assert_is_tap`), so an off-by-one capture cannot pass.
- SGLang vs the vLLM plugin: the same ``ATOL``/``RTOL`` (measured: vLLM vs transformers ~8e-7 relative on the
  61-layer checkpoint). This holds only with ``vllm_eagle3/model_patches/vllm_cpu_rope_3d.py`` (vLLM-CPU's rotary kernel
  mis-rotates 3-D MLA queries): without it vLLM was measured 47% off at tap 3 while SGLang stayed at ~1e-6.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_eagle3.conventions import ids_to_taps
from vllm_eagle3.spec import EMBED, CaptureSpecError, tap_label

pytestmark = pytest.mark.parity

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "sglang_harness"
SGLANG_PY = Path(os.environ.get("SGLANG_PYTHON", REPO / ".venv-sglang" / "bin" / "python"))
SGLANG_VERSION = "0.5.23"
ATOL = RTOL = 1e-4
# neighbouring taps must differ by at least this much (>= 100x ATOL) for the test to mean anything
NEIGHBOUR_MIN_DIFF = 1e-2
INCIDENT_LAYERS = 61  # the incident's Kimi K2.5 depth; [2, 30, 58] under the legacy +1 reaches tap 59
TRAINED_TAPS = (EMBED, 3, 31)  # the shipped head's wiring: cat([embed, tap 3, tap 31])

sys.path.insert(0, str(HARNESS))
import kimi_layout  # noqa: E402  (harness module; torch + safetensors only)


def require_sglang_env(python: Path = SGLANG_PY, make_target: str = "sglang-env") -> None:
    """Skip (locally) or fail (in CI) when an isolated SGLang venv is missing; every SGLang test module calls it."""
    if not python.exists():
        msg = f"SGLang venv missing ({python}); create it with `make {make_target}` (scripts/setup_sglang_env.sh)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def run_sglang(
    target: Path,
    cases: dict[str, tuple[Path, bool]],
    input_ids: list[int],
    out: Path,
    extra: list[str] = (),
    python: Path = SGLANG_PY,
) -> dict:
    """Run SGLang's own model on ``target`` for each case (name -> (draft dir, legacy patch?)) with the SGLang venv
    of ``python`` (default 0.5.23's); return its record."""
    if python == SGLANG_PY:
        require_sglang_env()
    cmd = [
        str(python),
        str(HARNESS / "runner.py"),
        "--target",
        str(target),
        "--input-ids",
        ",".join(map(str, input_ids)),
        "--out",
        str(out),
        *extra,
    ]
    for name, (draft, legacy) in cases.items():
        cmd += ["--case", f"{name}={draft}{':legacy' if legacy else ''}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHONPATH"))}
    env.update(SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=str(out.parent))
    if proc.returncode != 0 or not out.exists():
        pytest.fail(
            f"SGLang runner failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    record = torch.load(out, weights_only=False)
    record["log"] = proc.stdout + proc.stderr
    return record


def sglang_taps(record: dict, case: str) -> list[torch.Tensor]:
    """Split SGLang's packed aux tensor ``[T, K*H]`` into its K ``[T, H]`` slices (SGLang's concat order)."""
    c = record["cases"][case]
    assert c["error"] is None, f"SGLang case {case!r} failed: {c['error']}\n{c.get('traceback', '')[-3000:]}"
    aux, hidden = c["aux"], record["hidden_size"]
    assert aux is not None and aux.shape[-1] % hidden == 0, f"SGLang case {case!r}: aux {getattr(aux, 'shape', None)}"
    return list(aux.split(hidden, dim=-1))


def assert_real_sglang_run(record: dict, version: str, model_class: str, first_case: str) -> None:
    """The record comes from SGLang ``version``'s real ``model_class``, no stubbed sgl_kernel function ran in any
    case, and ``first_case`` went through SGLang's own ModelRunner path."""
    assert record["sglang_version"] == version
    assert record["model_class"] == model_class
    for name, case in record["cases"].items():
        assert case.get("stub_calls", []) == [], f"case {name}: stubbed sgl_kernel calls {case['stub_calls']}"
    first = record["cases"][first_case]
    assert first["ids_source"].startswith("ModelRunner("), "the first case must go through SGLang's runner path"


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def assert_is_tap(engine: str, got: torch.Tensor, hf_states, tap: int, atol: float = ATOL, rtol: float = RTOL) -> None:
    """``got`` equals HF ``hidden_states[tap]`` (bit-exact for the embedding) and clearly not its neighbours (the
    shared check, vllm_eagle3/testing/taps.py, with this module's tolerances)."""
    from vllm_eagle3.testing.taps import assert_is_tap as check

    check(got, hf_states, tap, atol=atol, rtol=rtol, neighbour=NEIGHBOUR_MIN_DIFF, where=engine)


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: one 61-layer DeepSeek-V3 (every text case in ONE SGLang process), the 32-layer Kimi K2.5.


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    from vllm_eagle3.testing.engine import prompt_ids

    return prompt_ids()


@pytest.fixture(scope="module")
def dsv3_61(tiny_root) -> Path:
    """A random 61-layer DeepSeek-V3 (the incident's depth), float32."""
    from vllm_eagle3.testing.tiny import build_deepseek_v3

    folder = tiny_root / "dsv3_61"
    if not (folder / "config.json").exists():
        build_deepseek_v3(folder, num_layers=INCIDENT_LAYERS)
    return folder


DSV3_CASES = {
    # name: (draft ids, apply the legacy patch?) — unpatched cases first: the patch is process-wide
    "sglang_0_3_31": ([0, 3, 31], False),
    "legacy_-1_2_30_unpatched": ([-1, 2, 30], False),
    "incident_2_30_58_on_0_5_23": ([2, 30, 58], False),
    "legacy_-1_2_30": ([-1, 2, 30], True),
    "incident_2_30_58": ([2, 30, 58], True),
}


@pytest.fixture(scope="module")
def dsv3_run(dsv3_61, make_draft, prompt, tmp_path_factory) -> dict:
    cases = {name: (make_draft(dsv3_61, ids), legacy) for name, (ids, legacy) in DSV3_CASES.items()}
    return run_sglang(dsv3_61, cases, prompt, tmp_path_factory.mktemp("sglang") / "dsv3.pt")


@pytest.fixture(scope="module")
def dsv3_hf(dsv3_61, prompt):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(dsv3_61), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states


# ---------------------------------------------------------------------------------------------------------------
# DeepSeek-V3 (SGLang's DeepseekV2 code path, which Kimi K2.5's language model is).


def test_sglang_run_is_sglang_0_5_23_with_no_stubbed_kernel_called(dsv3_run):
    """The parity numbers come from SGLang 0.5.23's real classes; no stubbed sgl_kernel function ran."""
    assert_real_sglang_run(dsv3_run, SGLANG_VERSION, "DeepseekV3ForCausalLM", "sglang_0_3_31")


def test_sglang_ids_0_3_31_are_taps_embed_3_31(dsv3_run, dsv3_hf):
    """SGLang 0.5.23 reads [0, 3, 31] as taps 0/3/31 (no shift), tap 0 = the embedding, equal to transformers."""
    case = dsv3_run["cases"]["sglang_0_3_31"]
    taps = ids_to_taps(case["draft_ids"], "sglang", INCIDENT_LAYERS)
    assert taps == TRAINED_TAPS
    assert case["layers_to_capture"] == list(taps), "conventions 'sglang' row disagrees with SGLang's real code"
    for got, tap in zip(sglang_taps(dsv3_run, "sglang_0_3_31"), sorted(taps)):
        assert_is_tap("SGLang 0.5.23", got, dsv3_hf, tap)


def test_legacy_ids_with_patch_are_taps_embed_3_31(dsv3_run, dsv3_hf):
    """Legacy [-1, 2, 30] + vllm_eagle3/model_patches/sglang_embed_tap.py -> taps 0/3/31, identical to the
    0.5.23 [0, 3, 31] run."""
    case = dsv3_run["cases"]["legacy_-1_2_30"]
    assert case["legacy_patch"] and case["legacy_patch"]["sglang_version"] == SGLANG_VERSION
    taps = ids_to_taps(case["draft_ids"], "sglang-legacy", INCIDENT_LAYERS)
    assert taps == TRAINED_TAPS
    assert case["layers_to_capture"] == list(taps), "conventions 'sglang-legacy' row disagrees with the patch"
    got = sglang_taps(dsv3_run, "legacy_-1_2_30")
    for g, tap in zip(got, sorted(taps)):
        assert_is_tap("SGLang 0.5.23 + legacy patch", g, dsv3_hf, tap)
    for g, ref, tap in zip(got, sglang_taps(dsv3_run, "sglang_0_3_31"), sorted(taps)):
        assert torch.equal(g, ref), (
            f"tap {tap_label(tap)}: legacy-patched run differs from the 0.5.23 run by "
            f"{max_abs(g, ref):.3g} (same forward, same taps: must be identical)"
        )


def test_legacy_ids_without_patch_are_refused_by_sglang_0_5_23(dsv3_run):
    """Unpatched 0.5.23 cannot read -1 (the incident's fix): it fails loudly, as the 'sglang' convention says."""
    case = dsv3_run["cases"]["legacy_-1_2_30_unpatched"]
    assert case["legacy_patch"] is None
    assert case["layers_to_capture"] == [-1, 2, 30]
    assert case["error"] and "captured 2 of 3 aux hidden states" in case["error"], case["error"]
    with pytest.raises(CaptureSpecError):
        ids_to_taps([-1, 2, 30], "sglang", INCIDENT_LAYERS)


def test_incident_ids_under_legacy_plus_one_are_taps_3_31_59_not_the_trained_wiring(dsv3_run, dsv3_hf):
    """The incident: [2, 30, 58] under the legacy +1 captures taps 3/31/59 — not cat([embed, 3, 31]) it was trained
    on."""
    case = dsv3_run["cases"]["incident_2_30_58"]
    taps = ids_to_taps(case["draft_ids"], "sglang-legacy", INCIDENT_LAYERS)
    assert taps == (3, 31, 59)
    assert case["layers_to_capture"] == list(taps)
    got = sglang_taps(dsv3_run, "incident_2_30_58")
    for g, tap in zip(got, taps):
        assert_is_tap("SGLang 0.5.23 + legacy patch (incident ids)", g, dsv3_hf, tap)
    served = torch.cat(got, dim=-1)
    trained = torch.cat([dsv3_hf[t][0] for t in TRAINED_TAPS], dim=-1)
    assert served.shape == trained.shape  # same fan-in: nothing in the shapes reveals the wrong wiring
    slot_diffs = {
        f"slot {i}: tap {s} vs {tap_label(t)}": max_abs(g, dsv3_hf[t][0])
        for i, (g, s, t) in enumerate(zip(got, taps, TRAINED_TAPS))
    }
    print(f"incident wiring vs trained wiring, max abs diff per slot: {slot_diffs}")
    assert all(d > NEIGHBOUR_MIN_DIFF for d in slot_diffs.values()), (
        f"the incident's served input should differ from the trained input in every slot: {slot_diffs}"
    )


def test_incident_ids_on_sglang_0_5_23_are_taps_2_30_58(dsv3_run, dsv3_hf):
    """Unpatched 0.5.23 takes [2, 30, 58] literally (taps 2/30/58): the same JSON means a third wiring there."""
    case = dsv3_run["cases"]["incident_2_30_58_on_0_5_23"]
    taps = ids_to_taps(case["draft_ids"], "sglang", INCIDENT_LAYERS)
    assert taps == (2, 30, 58)
    assert case["layers_to_capture"] == list(taps)
    for g, tap in zip(sglang_taps(dsv3_run, "incident_2_30_58_on_0_5_23"), taps):
        assert_is_tap("SGLang 0.5.23 (incident ids)", g, dsv3_hf, tap)


# ---------------------------------------------------------------------------------------------------------------
# Kimi K2.5 (SGLang's KimiK25ForConditionalGeneration wrapping DeepseekV3ForCausalLM), text prefill.


@pytest.fixture(scope="module")
def kimi_sglang_dir(kimi_dir, tiny_root) -> Path:
    return kimi_layout.write_sglang_layout(kimi_dir, tiny_root / "kimi_sglang_layout")


@pytest.fixture(scope="module")
def kimi_run(kimi_dir, kimi_sglang_dir, make_draft, prompt, tmp_path_factory) -> dict:
    cases = {
        "sglang_0_3_31": (make_draft(kimi_dir, [0, 3, 31]), False),
        "legacy_-1_2_30": (make_draft(kimi_dir, [-1, 2, 30]), True),
    }
    return run_sglang(kimi_sglang_dir, cases, prompt, tmp_path_factory.mktemp("sglang") / "kimi.pt")


def test_kimi_k25_taps_equal_transformers(kimi_run, kimi_dir, prompt):
    """SGLang's KimiK25 delegates capture to its DeepseekV3 language model: both conventions give taps 0/3/31."""
    from vllm_eagle3.testing.tiny import load_kimi_k25_hf

    assert kimi_run["model_class"] == "KimiK25ForConditionalGeneration"
    num_layers = kimi_run["num_layers"]
    hf = load_kimi_k25_hf(kimi_dir)
    with torch.no_grad():
        states = hf(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    for case, convention in (("sglang_0_3_31", "sglang"), ("legacy_-1_2_30", "sglang-legacy")):
        c = kimi_run["cases"][case]
        taps = ids_to_taps(c["draft_ids"], convention, num_layers)
        assert taps == TRAINED_TAPS and c["layers_to_capture"] == list(taps)
        assert c["stub_calls"] == []
        for got, tap in zip(sglang_taps(kimi_run, case), sorted(taps)):
            assert_is_tap(f"SGLang KimiK25 ({case})", got, states, tap)


# ---------------------------------------------------------------------------------------------------------------
# SGLang vs the vLLM plugin, same checkpoint, same prompt.


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def vllm_taps(dsv3_61, make_draft, prompt, tmp_path_factory) -> list[torch.Tensor]:
    """The aux list the vLLM plugin hands the draft for spec [embed, 3, 31] (vLLM ids [0, 3, 31])."""
    from vllm_eagle3.testing.engine import start_engine, stop_engine
    from vllm_eagle3.testing.taps import prefill_taps
    from vllm_eagle3.testing.tiny import write_spec_yaml

    spec = write_spec_yaml(
        tmp_path_factory.mktemp("spec") / "spec.yaml",
        ["embed", 3, 31],
        num_layers=INCIDENT_LAYERS,
        draft_ids_convention="vllm",
    )
    engine = start_engine(dsv3_61, make_draft(dsv3_61, [0, 3, 31]), env={"EAGLE3_SPEC": str(spec)})
    try:
        return prefill_taps(engine, prompt)
    finally:
        stop_engine(engine)


def test_sglang_taps_equal_vllm_plugin_taps(dsv3_run, dsv3_hf, vllm_taps):
    """Both engines feed the draft the same [embed, 3, 31] tensors, in that order, at every position."""
    sg = sglang_taps(dsv3_run, "sglang_0_3_31")
    assert len(vllm_taps) == len(sg) == len(TRAINED_TAPS)
    for tap, s, v in zip(TRAINED_TAPS, sg, vllm_taps):
        where = f"tap {tap_label(tap)}: SGLang {tuple(s.shape)} vs vLLM plugin {tuple(v.shape)}"
        assert s.shape == v.shape, where
        if tap == EMBED:
            assert torch.equal(s, v), f"{where}: max abs diff {max_abs(s, v):.3g} (must be bit-identical)"
            continue
        assert torch.allclose(s, v, atol=ATOL, rtol=RTOL), (
            f"{where}: max abs diff {max_abs(s, v):.3g} (atol {ATOL}, rtol {RTOL})"
        )
        assert_is_tap("vLLM plugin", v, dsv3_hf, tap)  # and not a neighbouring tap


# ---------------------------------------------------------------------------------------------------------------
# Kimi K2.5 with an image: the embedding tap is the MERGED inputs_embeds (vision features at the placeholders).

IMAGE_SIDE_PATCHES = 4  # a 56x56 image: 4x4 patches of 14 px, merged 2x2 -> 4 image tokens
MM_REL_TOL = 1e-3


def image_patches(side_patches: int = IMAGE_SIDE_PATCHES, patch: int = 14) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic RGB test image (gradients + a checkerboard), normalized and cut into Kimi's patches.

    Normalization (mean = std = 0.5) and patch order (row-major patches, each ``[3, 14, 14]``) are those of
    transformers' ``Kimi_K25ImageProcessor.patchify`` (its fast processor needs torchvision, absent from the
    main venv); the point is only that both engines receive the SAME pixel patches.
    """
    side = side_patches * patch
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img = torch.stack([x / side, y / side, ((x // 7 + y // 7) % 2).float()], 0)  # [3, H, W] in [0, 1]
    img = (img - 0.5) / 0.5
    patches = img.reshape(3, side_patches, patch, side_patches, patch).permute(1, 3, 0, 2, 4)
    return patches.reshape(side_patches * side_patches, 3, patch, patch).contiguous(), torch.tensor(
        [[1, side_patches, side_patches]]
    )


@pytest.fixture(scope="module")
def kimi_mm(kimi_dir, kimi_sglang_dir, make_draft, tmp_path_factory):
    from vllm_eagle3.testing.tiny import MEDIA_PAD_ID, load_kimi_k25_hf

    pixel_values, grid = image_patches()
    n_tokens = (IMAGE_SIDE_PATCHES // 2) ** 2
    ids = list(b"look: ") + [MEDIA_PAD_ID] * n_tokens + list(b" -> a cat")
    folder = tmp_path_factory.mktemp("sglang_mm")
    torch.save({"pixel_values": pixel_values, "grid_thws": grid, "image_token_id": MEDIA_PAD_ID}, folder / "mm.pt")
    cases = {"sglang_0_3_31": (make_draft(kimi_dir, [0, 3, 31]), False)}
    record = run_sglang(kimi_sglang_dir, cases, ids, folder / "kimi_mm.pt", extra=["--mm", str(folder / "mm.pt")])
    hf = load_kimi_k25_hf(kimi_dir)
    with torch.no_grad():
        states = hf(
            input_ids=torch.tensor([ids]), pixel_values=pixel_values, image_grid_thw=grid, output_hidden_states=True
        ).hidden_states
        text_only_embed = hf.get_input_embeddings()(torch.tensor([ids]))[0]
    image_rows = torch.tensor([t == MEDIA_PAD_ID for t in ids])
    return record, states, text_only_embed, image_rows


def test_kimi_k25_image_prefill_embedding_tap_carries_vision_features(kimi_mm):
    """Tap 0 of an image prefill is the merged inputs_embeds in SGLang as in transformers: vision features at the
    placeholder rows (not the placeholder token's embedding), text rows bit-identical; taps 3/31 follow.

    Tolerance: the image rows come out of two different vision towers (SGLang's MoonViT vs transformers'
    Kimi_K25 vision model: their own attention, 2D rope and position-embedding interpolation code) in float32;
    measured relative error ~2e-4 on the image rows and ~1e-4 at taps 3/31, so ``MM_REL_TOL = 1e-3``
    (norm-relative). Replacing the features by the placeholder embedding changes them by O(1) relative.
    """
    record, states, text_only_embed, image_rows = kimi_mm
    case = record["cases"]["sglang_0_3_31"]
    assert case["error"] is None, case["error"]
    assert case["stub_calls"] == []
    taps = sglang_taps(record, "sglang_0_3_31")
    embed = case["embed"]  # the input_embeds SGLang's KimiK25 handed its DeepSeek decoder stack
    assert torch.equal(taps[0], embed), "SGLang's tap 0 is not the merged input_embeds of its decoder stack"
    hf0 = states[0][0]
    assert torch.equal(taps[0][~image_rows], hf0[~image_rows]), (
        f"SGLang tap embed, text rows: max abs diff {max_abs(taps[0][~image_rows], hf0[~image_rows]):.3g} "
        f"vs transformers"
    )
    img_err = _rel(taps[0][image_rows], hf0[image_rows])
    assert img_err < MM_REL_TOL, (
        f"SGLang tap embed, image rows {tuple(taps[0][image_rows].shape)}: relative error "
        f"{img_err:.3g}, max abs diff {max_abs(taps[0][image_rows], hf0[image_rows]):.3g}"
    )
    placeholder_err = _rel(text_only_embed[image_rows], hf0[image_rows])
    assert placeholder_err > 100 * MM_REL_TOL, "the image rows of tap 0 do not differ from the placeholder embedding"
    for got, tap in zip(taps[1:], (3, 31)):
        err = _rel(got, states[tap][0])
        assert err < MM_REL_TOL, (
            f"SGLang tap {tap} (image prefill) {tuple(got.shape)} vs transformers "
            f"{tuple(states[tap][0].shape)}: relative error {err:.3g}, "
            f"max abs diff {max_abs(got, states[tap][0]):.3g}"
        )
