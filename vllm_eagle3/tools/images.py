"""Images through the served path: test images, OpenAI chat messages carrying them, and the measurement of
``python -m vllm_eagle3.tools.images`` (image-prompt acceptance and speed with vs without speculation, next to
the same prompts without images).

Data flow position: client side, end to end. vLLM's Kimi K2.5 processor turns each ``image_url`` part into
``<|media_pad|>`` tokens (one per 2x2 merged 14-px patch) whose rows of ``inputs_embeds`` the vision tower fills;
the plugin's tap 0 (``embed``) is that merged tensor. The vision config sets ``hf-overrides:
{use_unified_vision_chunk: true}`` because vLLM's chat renderer maps ``image_url`` to the modality ``vision_chunk``
(the only one ``KimiK25ForConditionalGeneration`` accepts) only when the model's config says so, as Moonshot's does.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3 import envs

PATCH = 14  # the miniature's (and Kimi K2.5's) ViT patch size
MERGE = 2  # 2x2 patches merged into one image token
IN_PATCH_LIMIT = 1024  # preprocessor_config.json media_proc_cfg.in_patch_limit: larger images are scaled down
DEFAULT_VISION_CONFIG = "configs/serve_kimi_k25_mini_vision.yaml"

# (width, height): square, wide 3:1, tall 2:7, a non-multiple of 28 (padded by the processor), one at the patch limit
IMAGE_SIZES = ((56, 56), (168, 56), (56, 196), (101, 67), (448, 448))

# The miniature was trained on Python source: instructions whose answers it can continue (and draft).
INSTRUCTIONS = (
    "Write a Python function that returns the width and height of this image.",
    "Here is a picture. Write a Python class that stores it.",
    "Describe the image, then show Python code that loads it with PIL.",
    "What is in this image? Answer with a Python dict.",
    "Write a Python function that counts the pixels of this image.",
)


def make_png(width: int, height: int, seed: int = 0) -> bytes:
    """A deterministic RGB PNG of ``width`` x ``height``: horizontal / vertical gradients and a 7-px checkerboard
    shifted by ``seed`` (different seeds give different pixels, so no two test images are the same media item)."""
    import numpy as np
    from PIL import Image

    y, x = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    rgb = np.stack(
        [
            (x * 255) // max(width - 1, 1),
            (y * 255) // max(height - 1, 1),
            (((x + seed) // 7 + y // 7) % 2) * (255 - 16 * (seed % 8)),
        ],
        -1,
    ).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """``data:<mime>;base64,...``: an image sent inline (no network needed on the server)."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict[str, Any]:
    """An OpenAI chat content part carrying one image."""
    return {"type": "image_url", "image_url": {"url": url}}


def image_tokens(width: int, height: int) -> int:
    """``<|media_pad|>`` tokens vLLM's Kimi K2.5 processor makes for one image (its ``navit_resize_image``: scaled
    to at most :data:`IN_PATCH_LIMIT` patches, padded to a multiple of 28 px, one token per 2x2 patches)."""
    scale = min(1.0, math.sqrt(IN_PATCH_LIMIT / (max(1.0, width // PATCH) * max(1.0, height // PATCH))))
    w, h = max(1, int(width * scale)), max(1, int(height * scale))
    factor = PATCH * MERGE
    return math.ceil(w / factor) * math.ceil(h / factor)


def image_prompts(sizes: Sequence[tuple[int, int]] = IMAGE_SIZES, seed: int = 0) -> list[dict[str, Any]]:
    """Chat prompts with images, each ``{"name", "messages", "text_messages", "image_tokens"}``:

    - one per size in ``sizes`` (image first, then an instruction);
    - two images in one prompt (text between them);
    - image + multi-turn text (user: image + question, assistant: an answer, user: a follow-up).

    ``text_messages`` is the same conversation with the images removed: the text-only prompt the acceptance of the
    image prompt is reported next to.
    """
    out: list[dict[str, Any]] = []
    for i, (w, h) in enumerate(sizes):
        text = INSTRUCTIONS[i % len(INSTRUCTIONS)]
        msgs = [
            {
                "role": "user",
                "content": [image_part(data_url(make_png(w, h, seed + i))), {"type": "text", "text": text}],
            }
        ]
        out.append(
            {
                "name": f"image {w}x{h}",
                "messages": msgs,
                "text_messages": [{"role": "user", "content": text}],
                "image_tokens": image_tokens(w, h),
            }
        )
    a, b = (84, 56), (56, 112)
    two = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare the first image"},
                image_part(data_url(make_png(*a, seed + 50))),
                {"type": "text", "text": "with the second image"},
                image_part(data_url(make_png(*b, seed + 51))),
                {"type": "text", "text": "and write a Python function that returns which one is wider."},
            ],
        }
    ]
    out.append(
        {
            "name": f"two images {a[0]}x{a[1]} + {b[0]}x{b[1]}",
            "messages": two,
            "text_messages": [
                {
                    "role": "user",
                    "content": "Compare the first image with the second image and "
                    "write a Python function that returns which one is wider.",
                }
            ],
            "image_tokens": image_tokens(*a) + image_tokens(*b),
        }
    )
    c = (112, 84)
    turns = [
        {
            "role": "user",
            "content": [
                image_part(data_url(make_png(*c, seed + 60))),
                {"type": "text", "text": "What is in this image?"},
            ],
        },
        {"role": "assistant", "content": "A gradient with a checkerboard pattern."},
        {"role": "user", "content": "Write a Python function that draws it with numpy."},
    ]
    text_turns = [{"role": "user", "content": "What is in this image?"}, turns[1], turns[2]]
    out.append(
        {
            "name": f"image {c[0]}x{c[1]} + multi-turn text",
            "messages": turns,
            "text_messages": text_turns,
            "image_tokens": image_tokens(*c),
        }
    )
    return out


def chat_tokens(client, model: str, messages: list, max_tokens: int, ignore_eos: bool = True) -> dict[str, Any]:
    """One greedy chat completion; the prompt and completion token ids (vLLM's ``return_token_ids``), text, seconds."""
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0.0,
        extra_body={"return_token_ids": True, "ignore_eos": ignore_eos},
    )
    seconds = time.perf_counter() - t0
    extra = r.model_extra or {}
    choice = r.choices[0]
    return {
        "prompt_token_ids": list(extra.get("prompt_token_ids") or []),
        "token_ids": list((choice.model_extra or {}).get("token_ids") or []),
        "text": choice.message.content or "",
        "completion_tokens": r.usage.completion_tokens,
        "prompt_tokens": r.usage.prompt_tokens,
        "seconds": seconds,
    }


def ask_image(
    base_url: str,
    image: bytes | str,
    question: str,
    max_tokens: int = 64,
    model: str | None = None,
    mime: str = "image/png",
    out=print,
) -> dict[str, Any]:
    """Send one image (PNG bytes, or a URL / data URL string) and a question as one chat message; print the answer,
    the prompt's image tokens, tokens/s and, when the server speculates, the acceptance over this request (vLLM's
    ``/metrics`` counters before and after). Returns the :func:`chat_tokens` result plus ``counters``."""
    from openai import OpenAI

    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
    from vllm_eagle3.tools.serve.process import served_model_name

    url = image if isinstance(image, str) else data_url(image, mime)
    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0)
    model = model or served_model_name(base_url)
    try:
        before: Any = SpecDecodeCounters.fetch(base_url)
    except LookupError:
        before = None
    messages = [{"role": "user", "content": [image_part(url), {"type": "text", "text": question}]}]
    r = chat_tokens(client, model, messages, max_tokens, ignore_eos=False)
    counters = None if before is None else SpecDecodeCounters.fetch(base_url) - before
    out(f"- chat with an image, user: {question!r}")
    out("      | " + r["text"].replace("\n", "\n      | "))
    out(
        f"  {r['prompt_tokens']} prompt tokens, {r['completion_tokens']} tokens in {r['seconds']:.2f} s = "
        f"{r['completion_tokens'] / r['seconds']:.1f} tok/s"
    )
    out(
        "speculative decoding: "
        + ("off (no vllm:spec_decode_* counters in /metrics)" if counters is None else counters.summary())
    )
    return {**r, "counters": counters}


# ------------------------------------------------------------------------------------------------- the benchmark


def _run_group(base_url: str, model: str, conversations: Sequence[list], max_tokens: int) -> dict[str, Any]:
    """Each conversation once, greedy, concurrency 1 (after one short warm-up request, not counted): token ids,
    decode rate and, on a speculative server, the spec-decode counters of these requests."""
    from openai import OpenAI

    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
    chat_tokens(client, model, conversations[0], 4)
    try:
        before: Any = SpecDecodeCounters.fetch(base_url)
    except LookupError:
        before = None
    out = [chat_tokens(client, model, m, max_tokens) for m in conversations]
    tokens, seconds = sum(o["completion_tokens"] for o in out), sum(o["seconds"] for o in out)
    row: dict[str, Any] = {
        "requests": len(out),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 3),
        "token_ids": [o["token_ids"] for o in out],
    }
    if before is not None:
        c = SpecDecodeCounters.fetch(base_url) - before
        row.update(
            acceptance_length=round(c.acceptance_length, 4),
            drafts=int(c.drafts),
            per_position=[round(x, 4) for x in c.per_position],
        )
    return row


def bench_main(argv: Sequence[str] | None = None) -> int:
    """``python -m vllm_eagle3.tools.images``: see ``--help``."""
    from vllm_eagle3.tools import REPO
    from vllm_eagle3.tools.machine import loadavg, machine_info, now_utc
    from vllm_eagle3.tools.serve.process import VllmServer

    p = argparse.ArgumentParser(
        prog="python -m vllm_eagle3.tools.images",
        description="Image-prompt acceptance and speed with vs without EAGLE-3 on the served miniature: serve "
        "--config (EAGLE-3 on), send the image prompts of vllm_eagle3.tools.images.image_prompts "
        "(5 sizes / aspect ratios, two images in one prompt, image + multi-turn text) and the same "
        "conversations without images, greedy, one at a time; then the same config with "
        "--speculative-config None and the same requests. Writes acceptance length, per-position "
        "acceptance, tokens/s of both servers, their ratio and whether the greedy token ids match, "
        "with the machine, its load average and the commit, to --out.",
    )
    p.add_argument(
        "--config", default=DEFAULT_VISION_CONFIG, help="vLLM serve YAML with images enabled (default %(default)s)"
    )
    p.add_argument("--capture-spec", default="configs/kimi_k25_eagle3.yaml", help="default %(default)s")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default %(default)s)")
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="times each prompt set is sent per server (default %(default)s; more = tighter numbers)",
    )
    p.add_argument("--out", type=Path, default=Path("bench/images.json"), help="results JSON (default %(default)s)")
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for each server (default 900)")
    args = p.parse_args(argv)

    say = lambda line: print(f"[image-bench] {line}", flush=True)  # noqa: E731
    prompts = image_prompts()
    groups = {
        "image": [q["messages"] for q in prompts] * args.repeats,
        "text": [q["text_messages"] for q in prompts] * args.repeats,
    }
    meta = {
        "date": now_utc(),
        "machine": machine_info(),
        "load_before": loadavg(),
        "cpu_bind": envs.VLLM_CPU_OMP_THREADS_BIND,
        "config": args.config,
        "capture_spec": args.capture_spec,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "prompts": [{"name": q["name"], "image_tokens": q["image_tokens"]} for q in prompts],
    }
    results: dict[str, dict[str, Any]] = {}
    for name, extra in (("eagle3", ["--capture-spec", args.capture_spec]), ("none", ["--speculative-config", "None"])):
        server = VllmServer(["--config", args.config, *extra], cwd=REPO)
        say(f"starting {name}: vllm-eagle3 serve {' '.join(server.serve_args)} (log {server.log_path})")
        server.start()
        try:
            ready = server.wait_ready(timeout=args.timeout)
            say(f"{name} ready after {ready:.1f} s")
            model = "kimi-k25-mini"
            results[name] = {"startup_s": round(ready, 1)}
            for group, conversations in groups.items():
                load = loadavg()
                results[name][group] = _run_group(server.base_url, model, conversations, args.max_tokens)
                row = results[name][group]
                row["load_before"], row["load_after"] = load, loadavg()  # a shared box: what else was running
                say(
                    f"{name}, {group} prompts: {row['tokens_per_s']:.2f} tok/s"
                    + (f", acceptance length {row['acceptance_length']:.3f}" if "acceptance_length" in row else "")
                )
        finally:
            server.stop()
    summary = {}
    for group in groups:
        a, b = results["eagle3"][group], results["none"][group]
        summary[group] = {
            "acceptance_length": a["acceptance_length"],
            "per_position": a["per_position"],
            "drafts": a["drafts"],
            "tokens_per_s_eagle3": a["tokens_per_s"],
            "tokens_per_s_none": b["tokens_per_s"],
            "speedup": round(a["tokens_per_s"] / b["tokens_per_s"], 3),
            "greedy_identical": sum(x == y for x, y in zip(a["token_ids"], b["token_ids"])),
            "requests": a["requests"],
        }
        say(
            f"{group} prompts: acceptance length {a['acceptance_length']:.3f}, {a['tokens_per_s']:.2f} vs "
            f"{b['tokens_per_s']:.2f} tok/s = {summary[group]['speedup']:.2f}x; greedy identical "
            f"{summary[group]['greedy_identical']}/{a['requests']}"
        )
    meta["load_after"] = loadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "summary": summary, "servers": results}, indent=1) + "\n")
    say(f"wrote {args.out}")
    return 0 if all(s["greedy_identical"] == s["requests"] for s in summary.values()) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(bench_main())
