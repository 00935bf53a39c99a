#!/usr/bin/env python3
"""Send an image to a running vllm-eagle3 server with the OpenAI client (one chat message with an ``image_url``
part) and print the answer and, when the server speculates, the acceptance over this request.

    vllm-eagle3 serve --config configs/serve_kimi_k25_mini_vision.yaml --capture-spec configs/kimi_k25_eagle3.yaml &
    python examples/image_client.py --base-url http://127.0.0.1:8000                 # a generated test image
    python examples/image_client.py --image photo.png --question "What is this?"      # your own file

The image travels inline as a ``data:image/png;base64,...`` URL (the server needs no network). The bare OpenAI call
is :func:`send` below; the printing helper is ``vllm_eagle3.tools.images.ask_image``.
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path


def send(base_url: str, model: str, image_path: Path, question: str, max_tokens: int = 64) -> str:
    """The OpenAI-client request, nothing else: one user message with the image and the question."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY")
    mime = "image/jpeg" if image_path.suffix.lower() in (".jpg", ".jpeg") else "image/png"
    url = f"data:{mime};base64,{base64.b64encode(image_path.read_bytes()).decode()}"
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": question},
        ]}],
        max_tokens=max_tokens,
        temperature=0.0,
    )
    return r.choices[0].message.content or ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    p.add_argument("--model", default=None, help="model name (default: the first one /v1/models lists)")
    p.add_argument("--image", type=Path, default=None,
                   help="PNG or JPEG file (default: a generated 168x112 PNG: gradients and a checkerboard)")
    p.add_argument("--question", default="Write a Python function that returns the size of this image.",
                   help="text sent after the image (default: %(default)r)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default %(default)s)")
    args = p.parse_args(argv)

    from vllm_eagle3.tools.images import ask_image, make_png

    if args.image is not None and not args.image.is_file():
        p.error(f"--image {args.image}: no such file")
    data = args.image.read_bytes() if args.image else make_png(168, 112)
    mime = "image/jpeg" if args.image and args.image.suffix.lower() in (".jpg", ".jpeg") else "image/png"
    try:
        ask_image(args.base_url, data, args.question, max_tokens=args.max_tokens, model=args.model, mime=mime)
    except Exception as exc:  # noqa: BLE001 - show the server's answer (a 4xx names the reason)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
