"""Image prefill parity: on a Kimi K2.5 prefill WITH AN IMAGE, the plugin's embedding tap in vLLM is the MERGED
``inputs_embeds`` (vision features at the placeholder rows), i.e. transformers' ``output_hidden_states[0]``.

Guards the bug class "tap 0 = the token embedding of the prompt ids": vLLM's Kimi K2.5 wrapper runs the vision tower,
scatters its projected features into ``inputs_embeds`` at the ``<|media_pad|>`` rows and hands them to the DeepSeek
decoder stack; the plugin must capture THOSE (a tap recomputed from ``input_ids`` would put the placeholder token's
embedding at the image rows and the draft head, trained on merged embeddings, would see no image). Taps 3 and 31 of
the same prefill must follow (they are computed from the merged embeddings). SGLang's side of the same check is
``test_sglang_parity.py::test_kimi_k25_image_prefill_embedding_tap_carries_vision_features``.

One engine (float32, eager) with the plugin, spec ``[embed, 3, 31]`` and a draft with vLLM ids ``[0, 3, 31]``
prefills ``b"look: " <|media_pad|> b" -> a cat"`` with one 56x56 image (4x4 patches of 14 px, merged 2x2 -> 4
image tokens). What vLLM actually did is OBSERVED in the worker by hooks (``_install_mm_observers``): the normalized
pixel patches its ViT consumed (output of ``patch_embed.input_norm``: vLLM normalizes raw uint8 pixels on the device
by default), the grid, the projected vision features and the ``inputs_embeds`` the wrapper handed its language
model; the prompt ids with the placeholder expanded come from the request output. transformers'
``Kimi_K25ForConditionalGeneration`` then runs on exactly those ids and pixel patches.

Tolerances (float32 everywhere, same weights):
- text rows of tap 0: bit-identical (both look up the same float32 embedding rows).
- image rows of tap 0 and taps 3 / 31 (every position): norm-relative error < ``MM_REL_TOL`` = 1e-3, the
  SGLang test's bound. The image rows come out of two different vision towers (vLLM's MoonViT3d on CPU: patch
  projection as a GEMM, its own 2D rope and bicubic position-embedding interpolation, TORCH_SDPA ViT attention;
  transformers' Kimi_K25 vision model: Conv2d patch embedding, its own rope / resampling / attention code), and the
  decoder stacks differ as in ``test_capture_vllm.py`` (oneDNN vs torch matmul, fused vs looped MoE): float32
  re-association only. Measured on these weights: image rows of tap 0 6e-7 relative (max abs 4e-6); tap 3 1e-6
  relative (max abs 2e-5), tap 31 1.1e-6 relative (max abs 6e-5); the bound leaves ~1000x margin, yet the guarded
  bug is O(1): the placeholder token's embedding differs from the merged image rows by ~1.0 relative (asserted
  > 100 x MM_REL_TOL for both engines, so an unmerged tap 0 cannot pass). Run with ``-s`` to print the numbers.
- vLLM's captured tap 0 is also checked to be, bit for bit, the ``inputs_embeds`` its Kimi wrapper handed the
  decoder stack, and its image rows bit for bit the vision features vLLM's projector produced.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from test_sglang_parity import IMAGE_SIDE_PATCHES, MM_REL_TOL, _rel, max_abs
from vllm_eagle3.testing.engine import start_engine, stop_engine
from vllm_eagle3.testing.taps import install_recorder, recorded_taps
from vllm_eagle3.testing.tiny import MEDIA_PAD_ID, load_kimi_k25_hf, write_spec_yaml

pytestmark = pytest.mark.parity

HERE = Path(__file__).resolve().parent
PATCH = 14
N_IMAGE_TOKENS = (IMAGE_SIDE_PATCHES // 2) ** 2  # 2x2 merge
PROMPT_IDS = list(b"look: ") + [MEDIA_PAD_ID] + list(b" -> a cat")  # ONE placeholder: vLLM expands it


def make_image(side_patches: int = IMAGE_SIDE_PATCHES):
    """A deterministic 56x56 RGB PIL image (the SGLang test's pattern: x / y gradients + a 7-px checkerboard)."""
    import numpy as np
    from PIL import Image

    side = side_patches * PATCH
    y, x = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    rgb = np.stack([x * 255 // side, y * 255 // side, ((x // 7 + y // 7) % 2) * 255], -1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def _install_mm_observers(model: torch.nn.Module) -> str:
    """(Worker side, observation only.) Record what vLLM's Kimi K2.5 wrapper fed its vision tower and its decoder
    stack, and the vision features its projector produced.

    ``LLM.apply_model`` ships this function BY REFERENCE (the engine core forwards it to the worker with plain
    pickle), so the worker imports this module: :data:`HERE` is put on the engine processes' ``PYTHONPATH``."""
    rec: dict = {"pixels": [], "grid": [], "features": [], "inputs_embeds": []}

    def norm_out(module, args, output):  # patch_embed.input_norm: the normalized patches the ViT consumes
        rec["pixels"].append(output.detach().to("cpu", copy=True))

    def tower_in(module, args, kwargs):
        grid = args[1] if len(args) > 1 else kwargs.get("grid_thws")
        rec["grid"].append(torch.as_tensor(grid).detach().to("cpu", copy=True))

    def proj_out(module, args, output):  # mm_projector output: the vision features scattered into inputs_embeds
        rec["features"].append(output.detach().to("cpu", copy=True))

    def model_in(module, args, kwargs):  # the wrapper's forward: inputs_embeds = merged embeddings at prefill
        emb = kwargs.get("inputs_embeds")
        rec["inputs_embeds"].append(None if emb is None else emb.detach().to("cpu", copy=True))

    model.vision_tower.patch_embed.input_norm.register_forward_hook(norm_out)
    model.vision_tower.register_forward_pre_hook(tower_in, with_kwargs=True)
    model.mm_projector.register_forward_hook(proj_out)
    model.register_forward_pre_hook(model_in, with_kwargs=True)
    model._vllm_eagle3_mm_records = rec
    return type(model).__name__


def _mm_records(model: torch.nn.Module) -> dict:
    return model._vllm_eagle3_mm_records


@pytest.fixture(scope="module")
def vllm_mm(kimi_dir, make_draft, tmp_path_factory):
    """ONE engine: plugin + spec [embed, 3, 31] + draft [0, 3, 31], images enabled; prefill the image prompt."""
    from vllm import SamplingParams

    spec = write_spec_yaml(
        tmp_path_factory.mktemp("spec_mm") / "spec.yaml", ["embed", 3, 31], num_layers=32, draft_ids_convention="vllm"
    )
    t0 = time.monotonic()
    pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    engine = start_engine(
        kimi_dir,
        make_draft(kimi_dir, [0, 3, 31]),
        env={"EAGLE3_SPEC": str(spec), "PYTHONPATH": pythonpath},
        limit_mm_per_prompt={"vision_chunk": 1},
    )  # images on (start_engine defaults Kimi to 0)
    try:
        engine.llm.apply_model(install_recorder)
        engine.llm.apply_model(_install_mm_observers)
        image = {"type": "image", "image": make_image(), "uuid": None}
        out = engine.llm.generate(
            [{"prompt_token_ids": PROMPT_IDS, "multi_modal_data": {"vision_chunk": [image]}}],
            SamplingParams(max_tokens=1, temperature=0.0),
            use_tqdm=False,
        )
        taps = engine.llm.apply_model(recorded_taps)[0]
        mm = engine.llm.apply_model(_mm_records)[0]
        log = engine.log()
    finally:
        stop_engine(engine)
    ids = list(out[0].prompt_token_ids)
    prefill = [r for r in taps if r and r[0].shape[0] == len(ids)]
    assert prefill, (
        f"no target forward over the {len(ids)}-token image prompt recorded; got shapes "
        f"{[[tuple(t.shape) for t in r] for r in taps]}"
    )
    embeds = [e for e in mm["inputs_embeds"] if e is not None and e.shape[0] == len(ids)]
    return dict(ids=ids, taps=prefill[0], mm=mm, embeds=embeds, log=log, seconds=time.monotonic() - t0)


@pytest.fixture(scope="module")
def hf_mm(kimi_dir, vllm_mm):
    """transformers on the ids vLLM prefilled and the pixel patches vLLM's ViT consumed."""
    mm = vllm_mm["mm"]
    assert len(mm["pixels"]) == 1 and len(mm["grid"]) == 1, (
        f"expected one vision-tower call, got {len(mm['pixels'])} (grids {mm['grid']})"
    )
    pixel_values = mm["pixels"][0].view(-1, 3, PATCH, PATCH)
    grid = mm["grid"][0].reshape(-1, 3)
    ids = torch.tensor([vllm_mm["ids"]])
    hf = load_kimi_k25_hf(kimi_dir)
    with torch.no_grad():
        states = hf(
            input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid, output_hidden_states=True
        ).hidden_states
        text_only_embed = hf.get_input_embeddings()(ids)[0]
    image_rows = ids[0] == MEDIA_PAD_ID
    return dict(
        states=states, text_only_embed=text_only_embed, image_rows=image_rows, pixel_values=pixel_values, grid=grid
    )


def test_vllm_expanded_the_image_placeholder(vllm_mm, hf_mm):
    """vLLM prefilled the prompt with the one placeholder expanded to the image's 4 tokens, from a 4x4-patch grid."""
    ids = vllm_mm["ids"]
    want = list(b"look: ") + [MEDIA_PAD_ID] * N_IMAGE_TOKENS + list(b" -> a cat")
    assert ids == want, f"vLLM prefilled {ids}, expected {want}"
    assert hf_mm["grid"].tolist() == [[1, IMAGE_SIDE_PATCHES, IMAGE_SIDE_PATCHES]], hf_mm["grid"]
    assert tuple(hf_mm["pixel_values"].shape) == (IMAGE_SIDE_PATCHES**2, 3, PATCH, PATCH)
    px = hf_mm["pixel_values"]
    assert px.min() >= -1.0 and px.max() <= 1.0 and px.min() < -0.9 and px.max() > 0.9, (
        f"vLLM's ViT input is not normalized to [-1, 1] (mean = std = 0.5): range [{px.min():.3g}, {px.max():.3g}]"
    )
    assert "capturing taps [embed, 3, 31]" in vllm_mm["log"]


def test_kimi_k25_image_prefill_embedding_tap_carries_vision_features_vllm(vllm_mm, hf_mm):
    """Tap 0 of an image prefill in vLLM is the merged inputs_embeds, as in transformers: vision features at the
    placeholder rows (not the placeholder token's embedding), text rows bit-identical; taps 3 / 31 follow."""
    taps, states, image_rows = vllm_mm["taps"], hf_mm["states"], hf_mm["image_rows"]
    assert len(taps) == 3, f"vLLM plugin handed the draft {len(taps)} aux tensors, expected 3 (embed, 3, 31)"
    tap0, hf0 = taps[0], states[0][0]
    assert tap0.shape == hf0.shape, f"vLLM tap embed shape {tuple(tap0.shape)} != transformers {tuple(hf0.shape)}"
    assert int(image_rows.sum()) == N_IMAGE_TOKENS

    # Tap 0 is what vLLM's Kimi wrapper handed its decoder stack, and its image rows are vLLM's vision features.
    assert len(vllm_mm["embeds"]) == 1, f"expected one prefill forward with inputs_embeds, got {len(vllm_mm['embeds'])}"
    assert torch.equal(tap0, vllm_mm["embeds"][0]), (
        f"vLLM tap embed is not the inputs_embeds of the prefill: max abs {max_abs(tap0, vllm_mm['embeds'][0]):.3g}"
    )
    features = torch.cat(vllm_mm["mm"]["features"]).reshape(-1, tap0.shape[1])
    assert torch.equal(tap0[image_rows], features), (
        f"vLLM tap embed image rows {tuple(tap0[image_rows].shape)} are not vLLM's projected vision features "
        f"{tuple(features.shape)}"
    )

    text_diff = max_abs(tap0[~image_rows], hf0[~image_rows])
    assert torch.equal(tap0[~image_rows], hf0[~image_rows]), (
        f"vLLM tap embed, text rows {tuple(tap0[~image_rows].shape)}: max abs diff {text_diff:.3g} vs transformers"
    )
    img_err = _rel(tap0[image_rows], hf0[image_rows])
    img_abs = max_abs(tap0[image_rows], hf0[image_rows])
    assert img_err < MM_REL_TOL, (
        f"vLLM tap embed, image rows {tuple(tap0[image_rows].shape)}: relative error "
        f"{img_err:.3g}, max abs diff {img_abs:.3g} vs transformers hidden_states[0]"
    )
    placeholder_err = _rel(hf_mm["text_only_embed"][image_rows], hf0[image_rows])
    tap_vs_placeholder = _rel(tap0[image_rows], hf_mm["text_only_embed"][image_rows])
    assert placeholder_err > 100 * MM_REL_TOL and tap_vs_placeholder > 100 * MM_REL_TOL, (
        f"the image rows of tap 0 do not differ from the placeholder embedding (transformers {placeholder_err:.3g}, "
        f"vLLM {tap_vs_placeholder:.3g} relative): the test cannot tell merged from unmerged embeddings"
    )
    report = [
        f"embed: text rows bit-identical; image rows rel {img_err:.3g}, max abs {img_abs:.3g} "
        f"(placeholder embedding: rel {placeholder_err:.3g})"
    ]
    for got, tap in zip(taps[1:], (3, 31)):
        want = states[tap][0]
        assert got.shape == want.shape, f"vLLM tap {tap} shape {tuple(got.shape)} != transformers {tuple(want.shape)}"
        err, diff = _rel(got, want), max_abs(got, want)
        assert err < MM_REL_TOL, (
            f"vLLM tap {tap} (image prefill) {tuple(got.shape)} vs transformers "
            f"hidden_states[{tap}] {tuple(want.shape)}: relative error {err:.3g}, "
            f"max abs diff {diff:.3g}"
        )
        report.append(
            f"tap {tap}: rel {err:.3g}, max abs {diff:.3g}, image rows max abs "
            f"{max_abs(got[image_rows], want[image_rows]):.3g}"
        )
    print(f"\n[vLLM image prefill vs transformers, engine+prefill {vllm_mm['seconds']:.0f} s] " + "; ".join(report))
