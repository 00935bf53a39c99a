#!/usr/bin/env python3
"""Send an image to a running vLLM server (vllm-eagle3 or plain vLLM) with the OpenAI client: one chat message with an
``image_url`` part; print the answer and its tokens/s.

    vllm-eagle3 serve --config configs/serve_kimi_k25_mini_vision.yaml &
    python examples/image_client.py                      # a generated test image; --base-url or $OPENAI_BASE_URL
    python examples/image_client.py --image photo.png --question "What is this?"   # your own file

The image travels inline as a ``data:image/png;base64,...`` URL (the server needs no network). Standalone: needs
only ``pip install openai``; copy it into an application as it is. ``examples/client.py`` also prints the
acceptance from ``/metrics``.
"""

from __future__ import annotations

import argparse
import base64
import os
import struct
import sys
import time
import zlib
from pathlib import Path


def test_png(width: int = 168, height: int = 112) -> bytes:
    """A PNG made with the standard library: red and green gradients over a 7-pixel blue checkerboard."""
    rows = b"".join(
        b"\x00"
        + bytes(
            v
            for x in range(width)
            for v in (x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), 255 * ((x // 7 + y // 7) % 2))
        )
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


DEFAULT_BASE_URL = "http://localhost:8000/v1"  # vLLM's OpenAI-compatible server, as vLLM's docs write it


def urls(base_url: str) -> tuple[str, str]:
    """(OpenAI base URL, server root) from either form: http://localhost:8000/v1 or http://localhost:8000 both give
    ("http://localhost:8000/v1", "http://localhost:8000"); the root serves /metrics and /health."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return root + "/v1", root


def connection_args(p: argparse.ArgumentParser) -> None:
    """--base-url and --api-key, defaulting to the OpenAI client's own environment variables."""
    p.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
        help=f"the server's OpenAI base URL, with or without /v1 (default: $OPENAI_BASE_URL, else {DEFAULT_BASE_URL})",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or "EMPTY",
        help="the server's --api-key, if it has one (default: $OPENAI_API_KEY, else EMPTY)",
    )


def send(
    base_url: str,
    model: str | None,
    image: bytes,
    mime: str,
    question: str,
    max_tokens: int = 64,
    api_key: str = "EMPTY",
):
    """The OpenAI-client request, nothing else: one user message with the image and the question."""
    from openai import OpenAI

    client = OpenAI(base_url=urls(base_url)[0], api_key=api_key)
    url = f"data:{mime};base64,{base64.b64encode(image).decode()}"
    return client.chat.completions.create(
        model=model or client.models.list().data[0].id,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": question},
                ],
            }
        ],
        max_tokens=max_tokens,
        temperature=0.0,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    connection_args(p)
    p.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    p.add_argument(
        "--image",
        type=Path,
        default=None,
        help="PNG or JPEG file (default: a generated 168x112 PNG: gradients and a checkerboard)",
    )
    p.add_argument(
        "--question",
        default="Write a Python function that returns the size of this image.",
        help="text sent after the image (default: %(default)r)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    args = p.parse_args(argv)
    if args.image is not None and not args.image.is_file():
        p.error(f"--image {args.image}: no such file (give a PNG or JPEG file, or leave --image out)")
    data = args.image.read_bytes() if args.image else test_png()
    mime = "image/jpeg" if args.image and args.image.suffix.lower() in (".jpg", ".jpeg") else "image/png"

    print(f"- chat with an image, user: {args.question!r}")
    t0 = time.perf_counter()
    try:
        r = send(args.base_url, args.model, data, mime, args.question, args.max_tokens, args.api_key)
    except Exception as exc:  # noqa: BLE001 - show the server's answer (a 4xx names the reason)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - t0
    print("      | " + (r.choices[0].message.content or "").replace("\n", "\n      | "))
    print(
        f"  {r.usage.prompt_tokens} prompt tokens, {r.usage.completion_tokens} tokens in {seconds:.2f} s = "
        f"{r.usage.completion_tokens / seconds:.1f} tok/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
