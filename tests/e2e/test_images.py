"""Images through the served path: `vllm-eagle3 serve --config configs/serve_kimi_k25_mini_vision.yaml` (EAGLE-3 on,
taps [embed, 3, 31]) and the OpenAI client with ``image_url`` parts, images made here (PNG data URLs).

Kimi K2.5's ``embed`` tap is the MERGED ``inputs_embeds``: vision features at the ``<|media_pad|>`` rows. Offline
that is proven by tests/parity/test_vllm_image_prefill.py; this file proves it where users meet it, through the
server:

- greedy output of the speculative server is token-identical to the same config without speculation for every
  image prompt (5 sizes / aspect ratios, two images in one prompt, image + multi-turn text), and each prompt holds
  the number of image tokens the Kimi processor's resize rule gives (so the images really reached the model);
- inside the served engine, read by a worker-side probe (:class:`ImageTapProbe`, a vLLM worker extension called
  through ``POST /collective_rpc``; nothing recomputed in the client), tap 0 of an image prefill at the image rows is
  the vision features vLLM's projector produced and the ``inputs_embeds`` its Kimi wrapper handed the decoder stack,
  bit for bit, and equals transformers' ``hidden_states[0]`` for the same ids and pixel patches (tolerance: see
  :func:`test_served_embed_tap_is_the_merged_vision_embedding`);
- served acceptance of the image prompts next to the same conversations without images (printed and recorded as
  test properties; checked against the counters' own bookkeeping and for collapse);
- bad images answered 4xx with the reason, and the server healthy afterwards.

Servers (module-scoped, one at a time on the 2-core box): ``plain`` (the vision config with
``--speculative-config None``) answers the image prompts once for the reference and stops; ``spec`` (the vision
config as shipped, plus the probe extension and ``VLLM_SERVER_DEV_MODE=1`` for ``/collective_rpc``; the extension
does nothing until the probe test installs its hooks) serves every other check.

Measured (2-core box loaded to ~20 by other jobs): 9 passed in 469 s, of which the two server starts 154 s and 161 s,
the 7 image prompts on the plain server 45 s, both prompt groups on the speculative one 45 s, the probe test 44 s
(transformers' forward included), the six bad-image cases 6 s (the unreachable URL 5 s: vLLM's retry back-off).
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3.tools.images import (
    DEFAULT_VISION_CONFIG,
    chat_tokens,
    data_url,
    image_part,
    image_prompts,
    image_tokens,
    make_png,
)
from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
from vllm_eagle3.tools.serve.process import VllmServer

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
VISION_CONFIG = REPO / DEFAULT_VISION_CONFIG
CAPTURE_SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
MODEL_NAME = "kimi-k25-mini"
START_TIMEOUT_S = 900
MAX_TOKENS = 48
IN_FLIGHT = 4
MAX_IMAGES = 2  # limit-mm-per-prompt: {vision_chunk: 2} in the vision config
MAX_MODEL_LEN = 1024
# Image rows of tap 0 vs transformers: norm-relative error bound (see the probe test's docstring).
MM_REL_TOL = 1e-3
LONG_TEXT = "def f(x):\n    return x\n" * 88  # ~800 tokens: fits max-model-len alone, not with a 448x448 image

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "config.json").is_file():
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET}, {DRAFT})"))


def say(line: str) -> None:
    print(f"[images] {line}", flush=True)


# ------------------------------------------------------------------------------------------- the worker-side probe

_PROBE_ATTR = "_vllm_eagle3_image_probe"


def _encode(t) -> dict:
    """A float32 tensor as JSON: shape + base64 of its bytes (exact; /collective_rpc answers JSON)."""
    import torch

    t = t.detach().to("cpu", torch.float32).contiguous()
    return {"shape": list(t.shape), "b64": base64.b64encode(t.numpy().tobytes()).decode()}


def decode(obj: dict):
    import numpy as np
    import torch

    return torch.from_numpy(np.frombuffer(base64.b64decode(obj["b64"]), dtype=np.float32).copy()).view(obj["shape"])


class ImageTapProbe:
    """vLLM worker extension (``--worker-extension-cls test_images.ImageTapProbe``): observes, in the worker, what the
    served Kimi K2.5 target did with an image prompt. Loaded, it changes nothing; :meth:`image_probe_start` installs
    forward hooks (once) on the target ``model_runner.model`` and clears their records; :meth:`image_probe_take`
    returns them. Recorded per forward: the aux list the target handed the EAGLE-3 draft (the plugin's taps, in spec
    order), the ``inputs_embeds`` the Kimi wrapper received (the merged embeddings at a prefill), the normalised
    pixel patches vLLM's ViT consumed (``patch_embed.input_norm`` output), the ``grid_thws`` and the projector's
    output (the vision features scattered into ``inputs_embeds``). Same hooks as the offline parity test."""

    def image_probe_start(self) -> dict:
        import torch

        from vllm_eagle3.testing.taps import spec_taps_of

        model = self.model_runner.model  # type: ignore[attr-defined]
        rec = getattr(model, _PROBE_ATTR, None)
        if rec is None:
            rec = {"taps": [], "inputs_embeds": [], "pixels": [], "grid": [], "features": []}

            def target_out(module, args, output):
                if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], list):
                    rec["taps"].append([t.detach().to("cpu", copy=True) for t in spec_taps_of(model, output[1])])

            def target_in(module, args, kwargs):
                emb = kwargs.get("inputs_embeds")
                rec["inputs_embeds"].append(None if emb is None else emb.detach().to("cpu", copy=True))

            def tower_in(module, args, kwargs):
                grid = args[1] if len(args) > 1 else kwargs.get("grid_thws")
                rec["grid"].append(torch.as_tensor(grid).detach().to("cpu", copy=True).reshape(-1, 3))

            model.register_forward_hook(target_out)
            model.register_forward_pre_hook(target_in, with_kwargs=True)
            model.vision_tower.register_forward_pre_hook(tower_in, with_kwargs=True)
            model.vision_tower.patch_embed.input_norm.register_forward_hook(
                lambda m, a, out: rec["pixels"].append(out.detach().to("cpu", copy=True))
            )
            model.mm_projector.register_forward_hook(
                lambda m, a, out: rec["features"].append(out.detach().to("cpu", copy=True))
            )
            setattr(model, _PROBE_ATTR, rec)
        for records in rec.values():
            records.clear()
        return {"pid": os.getpid(), "model": type(model).__name__}

    def image_probe_take(self) -> dict:
        rec = getattr(self.model_runner.model, _PROBE_ATTR)  # type: ignore[attr-defined]
        return {
            "taps": [[_encode(t) for t in forward] for forward in rec["taps"]],
            "inputs_embeds": [None if e is None else _encode(e) for e in rec["inputs_embeds"]],
            "pixels": [_encode(p) for p in rec["pixels"]],
            "grid": [g.tolist() for g in rec["grid"]],
            "features": [_encode(f) for f in rec["features"]],
        }


def worker_rpc(server: VllmServer, method: str) -> list:
    req = urllib.request.Request(
        server.base_url + "/collective_rpc",
        data=json.dumps({"method": method}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())["results"]


# ------------------------------------------------------------------------------------------------------ servers


def start_server(name: str, args: list[str], env: dict[str, str] | None = None) -> VllmServer:
    server = VllmServer(args, cwd=REPO, env={**os.environ, **(env or {})})
    say(f"starting {name}: vllm-eagle3 serve {' '.join(args)} (log {server.log_path})")
    server.start()
    ready = server.wait_ready(timeout=START_TIMEOUT_S, progress=say, progress_every=30)
    say(f"{name} ready after {ready:.1f} s")
    return server


def client_for(server: VllmServer):
    from openai import OpenAI

    return OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    return image_prompts()


def run_prompts(server: VllmServer, conversations: list[list]) -> tuple[list[dict], float]:
    client = client_for(server)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as ex:
        out = list(ex.map(lambda m: chat_tokens(client, MODEL_NAME, m, MAX_TOKENS), conversations))
    return out, time.perf_counter() - t0


@pytest.fixture(scope="module")
def reference(prompts) -> list[dict]:
    """The image prompts answered by the vision config WITHOUT speculation (started, used, stopped)."""
    server = start_server("plain", ["--config", str(VISION_CONFIG), "--speculative-config", "None"])
    try:
        out, seconds = run_prompts(server, [p["messages"] for p in prompts])
    finally:
        server.stop()
    say(f"plain: {len(out)} image prompts x {MAX_TOKENS} tokens in {seconds:.1f} s")
    return out


@pytest.fixture(scope="module")
def spec() -> VllmServer:
    """The shipped vision config (EAGLE-3 on) + the probe extension. The first test asks for ``reference`` before
    ``served``, so in a full run ``plain`` has stopped before this one starts."""
    # The vision config's table at a fixed k (live k off) and the per-request draft back-off off: the acceptance test
    # accounts for every token after the first as verified, which a k = 0 step (live k's sweep drafts it) or a paused
    # request's step is not.
    plugin = json.dumps({"vllm_eagle3": {"live_k": False, "draft_backoff": False}})
    server = start_server(
        "spec",
        [
            "--config",
            str(VISION_CONFIG),
            "--capture-spec",
            str(CAPTURE_SPEC),
            "--additional-config",
            plugin,
            "--worker-extension-cls",
            "test_images.ImageTapProbe",
        ],
        env={
            "VLLM_SERVER_DEV_MODE": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        },
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(spec, prompts) -> dict:
    """The image prompts, then the same conversations without images, on the speculative server; the spec-decode
    counters of each group."""
    groups = {}
    for group, key in (("image", "messages"), ("text", "text_messages")):
        before = SpecDecodeCounters.fetch(spec.base_url)
        out, seconds = run_prompts(spec, [p[key] for p in prompts])
        groups[group] = {"out": out, "seconds": seconds, "counters": SpecDecodeCounters.fetch(spec.base_url) - before}
        say(
            f"spec, {group} prompts: {len(out)} x {MAX_TOKENS} tokens in {seconds:.1f} s; "
            f"{groups[group]['counters'].summary()}"
        )
    return groups


def assert_healthy(server: VllmServer, after: str) -> None:
    assert server.healthy(timeout=10), (
        f"/health is down after {after}: the engine died; log {server.log_path}:\n{server.log_tail()}"
    )


# -------------------------------------------------------------------------------------------------------- tests


def test_image_prompts_reach_the_model_and_greedy_is_token_identical(prompts, reference, served, spec):
    """Every image prompt: the prompt ids hold the image tokens the processor's resize rule gives (the images were
    not dropped or refused), and the speculative server's greedy token ids equal the plain server's."""
    media_pad = json.loads((TARGET / "config.json").read_text())["image_token_id"]
    mismatched = []
    for p, ref, got in zip(prompts, reference, served["image"]["out"]):
        n_pad = got["prompt_token_ids"].count(media_pad)
        assert n_pad == p["image_tokens"], (
            f"{p['name']}: the served prompt holds {n_pad} <|media_pad|> tokens, "
            f"the processor's rule gives {p['image_tokens']}"
        )
        assert got["prompt_token_ids"] == ref["prompt_token_ids"], f"{p['name']}: the two servers' prompts differ"
        assert len(got["token_ids"]) == MAX_TOKENS, f"{p['name']}: {len(got['token_ids'])} tokens, not {MAX_TOKENS}"
        if got["token_ids"] != ref["token_ids"]:
            first = next(i for i, (a, b) in enumerate(zip(got["token_ids"], ref["token_ids"])) if a != b)
            mismatched.append(f"{p['name']}: first difference at token {first}")
    say("image tokens per prompt: " + ", ".join(f"{p['name']}: {p['image_tokens']}" for p in prompts))
    assert not mismatched, f"speculative greedy output differs from the non-speculative server: {mismatched}"
    assert_healthy(spec, "the image prompts")


def test_served_embed_tap_is_the_merged_vision_embedding(spec, served):
    """In the served engine, the plugin's tap 0 of an image prefill is the merged ``inputs_embeds``: at the image
    rows, the vision features vLLM's projector produced (bit for bit) and transformers' ``hidden_states[0]`` for the
    same ids and pixel patches.

    Read in the worker by :class:`ImageTapProbe` over ``/collective_rpc`` during one chat request with a 112x84
    image no other request used (so vLLM's processor cache cannot stand in for the vision tower); the prompt ids
    come back from the server (``return_token_ids``). Checked:

    - tap 0 == the ``inputs_embeds`` the Kimi wrapper handed the decoder stack (bit for bit), and its image rows ==
      the projector's features (bit for bit): the tap is what the engine computed, not a recomputed lookup;
    - text rows of tap 0 bit-identical to transformers' ``hidden_states[0]`` (the same float32 embedding rows);
    - image rows within ``MM_REL_TOL`` = 1e-3 norm-relative of transformers' ``hidden_states[0]``: two different
      vision towers (vLLM's MoonViT3d on CPU: patch projection as a GEMM, its own 2-D rope and position-embedding
      interpolation, TORCH_SDPA attention; transformers' Kimi_K25 vision model: Conv2d patches, its own rope and
      attention) re-associate float32 sums; measured here 6.4e-7 (max abs 1.4e-7; taps 3 / 31 4.1e-7 / 5.7e-7,
      same bound), as the offline parity test's 6e-7; the bound leaves ~1000x margin, and the bug it guards (the
      placeholder token's embedding at the image rows) is O(1) away:
      asserted > 100 x the bound here, so an unmerged tap 0 cannot pass.
    """
    import torch

    media_pad = json.loads((TARGET / "config.json").read_text())["image_token_id"]
    started = worker_rpc(spec, "image_probe_start")
    assert len(started) == 1, f"expected one worker, got {started}"
    w, h = 112, 84
    messages = [
        {
            "role": "user",
            "content": [
                image_part(data_url(make_png(w, h, seed=1234))),
                {"type": "text", "text": "Write Python code for this image."},
            ],
        }
    ]
    answer = chat_tokens(client_for(spec), MODEL_NAME, messages, max_tokens=1)
    rec = worker_rpc(spec, "image_probe_take")[0]
    ids = answer["prompt_token_ids"]
    image_rows = torch.tensor(ids) == media_pad
    assert int(image_rows.sum()) == image_tokens(w, h)

    prefill = [[decode(t) for t in fwd] for fwd in rec["taps"] if fwd and fwd[0]["shape"][0] == len(ids)]
    assert len(prefill) == 1, (
        f"expected one target forward over the {len(ids)}-token prompt, got forwards of "
        f"{[fwd[0]['shape'] for fwd in rec['taps'] if fwd]}"
    )
    taps = prefill[0]
    assert len(taps) == 3, f"the target handed the draft {len(taps)} aux tensors, expected 3 ([embed, 3, 31])"
    tap0 = taps[0]
    embeds = [decode(e) for e in rec["inputs_embeds"] if e is not None and e["shape"][0] == len(ids)]
    assert len(embeds) == 1, f"expected one prefill with inputs_embeds, got {len(embeds)}"
    assert torch.equal(tap0, embeds[0]), "served tap 0 is not the inputs_embeds the Kimi wrapper handed its decoder"
    assert len(rec["features"]) == 1 and len(rec["pixels"]) == 1, (
        f"expected one vision-tower call, got {len(rec['pixels'])} (grids {rec['grid']})"
    )
    features = decode(rec["features"][0]).reshape(-1, tap0.shape[1])
    assert torch.equal(tap0[image_rows], features), "served tap 0's image rows are not the projector's features"

    from transformers import Kimi_K25ForConditionalGeneration

    hf = Kimi_K25ForConditionalGeneration.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    pixels = decode(rec["pixels"][0]).view(-1, 3, 14, 14)
    grid = torch.tensor(rec["grid"][0]).reshape(-1, 3)
    with torch.no_grad():
        states = hf(
            input_ids=torch.tensor([ids]), pixel_values=pixels, image_grid_thw=grid, output_hidden_states=True
        ).hidden_states
        placeholder = hf.get_input_embeddings()(torch.tensor([ids]))[0]
    hf0 = states[0][0]

    def rel(a, b) -> float:
        return float((a - b).norm() / b.norm())

    assert torch.equal(tap0[~image_rows], hf0[~image_rows]), (
        f"text rows of tap 0 differ from transformers: max abs {(tap0[~image_rows] - hf0[~image_rows]).abs().max()}"
    )
    err = rel(tap0[image_rows], hf0[image_rows])
    unmerged = rel(placeholder[image_rows], hf0[image_rows])
    say(
        f"probe: {len(ids)}-token prompt, {int(image_rows.sum())} image rows (grid {rec['grid'][0]}); tap 0 image "
        f"rows vs transformers hidden_states[0]: rel {err:.3g}, max abs "
        f"{(tap0[image_rows] - hf0[image_rows]).abs().max():.3g}; the placeholder embedding is rel {unmerged:.3g} away"
    )
    assert unmerged > 100 * MM_REL_TOL, f"the test cannot tell merged from unmerged embeddings (rel {unmerged:.3g})"
    assert err < MM_REL_TOL, f"tap 0 image rows vs transformers hidden_states[0]: relative error {err:.3g}"
    for got, layer in zip(taps[1:], (3, 31)):
        e = rel(got, states[layer][0])
        say(f"probe: tap {layer} vs transformers hidden_states[{layer}]: rel {e:.3g}")
        assert e < MM_REL_TOL, f"tap {layer} of the image prefill vs transformers: relative error {e:.3g}"
    assert_healthy(spec, "the probe")


def test_served_acceptance_image_vs_text_prompts(served, prompts, record_property):
    """Served acceptance (k=3) over the image prompts, next to the same conversations without the images.

    The head was trained on text only; the draft's own token-embedding input at image rows is the placeholder's
    (vLLM: "Draft model Eagle3LlamaForCausalLM does not support external multimodal embeddings"), while its ``fc``
    reads the merged tap 0. Recorded as properties and printed. Checked: the counters describe these requests (every
    generated token after the first comes from a verification step: drafts + accepted tokens >= completion tokens
    - requests, and at most k more per request, the tokens a last step may overshoot by), and the image prompts do
    not collapse acceptance (position-0 acceptance at least half the text prompts')."""
    k = 3
    rows = {}
    for group in ("image", "text"):
        c, out = served[group]["counters"], served[group]["out"]
        emitted = sum(o["completion_tokens"] - 1 for o in out)
        assert c.drafts > 0, f"{group} prompts: no drafts counted"
        assert emitted <= c.drafts + c.accepted <= emitted + k * len(out), (
            f"{group} prompts: {c.drafts:.0f} drafts + {c.accepted:.0f} accepted do not account for the {emitted} "
            f"tokens generated after the first: the counters do not describe these requests"
        )
        rows[group] = c
        record_property(f"{group}_acceptance_length", round(c.acceptance_length, 4))
        record_property(f"{group}_position0", round(c.per_position[0], 4))
        record_property(
            f"{group}_tokens_per_s", round(sum(o["completion_tokens"] for o in out) / served[group]["seconds"], 2)
        )
        say(f"{group} prompts ({len(out)}): {c.summary()}")
    assert rows["image"].per_position[0] >= 0.5 * rows["text"].per_position[0], (
        f"image prompts collapse acceptance: position-0 {rows['image'].per_position[0]:.3f} vs "
        f"{rows['text'].per_position[0]:.3f} without the images"
    )


def closed_port() -> int:
    """A loopback port nothing listens on: an image URL there is unreachable from the server whether or not the
    machine has a network (connection refused at once; vLLM still retries it, ~5 s of back-off)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bad_requests() -> dict[str, tuple[list, str]]:
    """name -> (messages, a phrase the 4xx answer must contain)."""
    text = {"type": "text", "text": "What is this?"}
    one = lambda url: [{"role": "user", "content": [text, image_part(url)]}]  # noqa: E731
    long_text = LONG_TEXT
    port = closed_port()
    return {
        "corrupt base64": (one("data:image/png;base64,iVBORw0KGgo***not base64***"), "base64"),
        "not an image": (one(data_url(b"this is plain text, not a PNG file")), "image"),
        "truncated PNG": (one(data_url(make_png(112, 112)[:200])), "image"),
        "too large for the context": (
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": long_text}, image_part(data_url(make_png(448, 448, 7)))],
                }
            ],
            "context",
        ),
        "more images than allowed": (
            [
                {
                    "role": "user",
                    "content": [text] + [image_part(data_url(make_png(56, 56, 20 + i))) for i in range(MAX_IMAGES + 1)],
                }
            ],
            f"At most {MAX_IMAGES}",
        ),
        "unreachable URL": (one(f"http://127.0.0.1:{port}/cat.png"), f"127.0.0.1:{port}"),
    }


def tokenize_chat(server: VllmServer, messages: list) -> int:
    """Prompt tokens of ``messages`` after the chat template (vLLM's ``POST /tokenize``; no generation)."""
    req = urllib.request.Request(
        server.base_url + "/tokenize",
        method="POST",
        data=json.dumps({"model": MODEL_NAME, "messages": messages}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback
        return int(json.loads(resp.read())["count"])


@pytest.mark.parametrize("case", list(_bad_requests()))
def test_bad_image_is_a_4xx_with_the_reason(spec, case):
    """A bad image is the client's error: HTTP 4xx whose message names it, and the server keeps serving.

    "too large for the context": no single image can overflow 1024 tokens (the processor scales any image to at most
    1024 patches, ~256 tokens), so ~800 tokens of text that fit alone (checked with ``/tokenize``) plus a 448x448
    image do. "unreachable URL": a loopback port nobody listens on (the same answer with or without a network);
    stock vLLM 0.32 answers it 500, vllm_eagle3/model_patches/vllm_media_fetch_unreachable.py makes it a 422 naming the
    URL."""
    import openai

    messages, phrase = _bad_requests()[case]
    t0 = time.perf_counter()
    with pytest.raises(openai.APIStatusError) as info:
        client_for(spec).chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0.0)
    err = info.value
    say(f"{case}: HTTP {err.status_code} in {time.perf_counter() - t0:.1f} s: {str(err)[:300]}")
    assert 400 <= err.status_code < 500, f"{case}: HTTP {err.status_code}, not 4xx: {err}"
    assert phrase.lower() in str(err).lower(), f"{case}: the answer does not name the reason ({phrase!r}): {err}"
    if case == "too large for the context":  # the text alone fits: the image's 256 tokens are what overflow
        alone = tokenize_chat(spec, [{"role": "user", "content": LONG_TEXT}])
        assert alone + image_tokens(448, 448) > MAX_MODEL_LEN >= alone, f"text alone {alone} tokens"
    assert_healthy(spec, case)
