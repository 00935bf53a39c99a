"""An SGLang speculative command line, read and checked: the flags that decide what SGLang drafts and verifies.

Data flow position: static, beside the engine. ``vllm-eagle3 inspect --sglang-args`` reads the flags a user passes
to SGLang (``--speculative-algorithm``, ``--speculative-num-steps``, ``--speculative-eagle-topk``,
``--speculative-num-draft-tokens``, ...) and reports combinations that SGLang silently overrides or that change
which hidden states reach the draft — the incident's ``--speculative-num-steps 1`` capped 16 draft tokens at 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path
from typing import Any, Mapping

from vllm_eagle3.spec import CaptureSpecError


@dataclasses.dataclass(frozen=True)
class Finding:
    """One warning: a stable ``code`` and a message that says what is wrong and how to fix it."""

    code: str
    message: str


# ----------------------------------------------------------------------------------------------- SGLang flags

SGLANG_FLAGS = {
    "speculative_algorithm": str,
    "speculative_draft_model_path": str,
    "speculative_num_steps": int,
    "speculative_eagle_topk": int,
    "speculative_num_draft_tokens": int,
    "enable_two_batch_overlap": bool,
    "model_path": str,
}


def parse_sglang_args(text: str) -> dict[str, Any]:
    """The speculative flags of an SGLang command line (a string, or ``@file`` / a file path holding one).

    Accepts ``--flag value`` and ``--flag=value``, line continuations and comments, and unambiguous prefixes (SGLang
    parses with argparse, which accepts them too). Unknown flags are ignored; a flag given twice keeps the last
    value, as argparse does.
    """
    path = Path(text[1:]) if text.startswith("@") else Path(text)
    if text.startswith("@") or (
        len(text) < 4096 and "\n" not in text and not text.lstrip().startswith("-") and path.is_file()
    ):
        if not path.is_file():
            raise CaptureSpecError(f"SGLang args file {path} does not exist")
        text = path.read_text()
    text = text.replace("\\\n", " ")
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:
        raise CaptureSpecError(f"cannot parse the SGLang command line ({exc}); check its quotes") from None
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=True, exit_on_error=False)
    for name, kind in SGLANG_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            p.add_argument(flag, dest=name, action="store_true", default=None)
        else:
            p.add_argument(flag, dest=name, default=None)
    p.add_argument("--model", dest="model_path", default=None)
    try:
        ns, _ = p.parse_known_args(tokens)
    except argparse.ArgumentError as exc:
        raise CaptureSpecError(f"SGLang args: {exc}") from None
    out: dict[str, Any] = {}
    for name, kind in SGLANG_FLAGS.items():
        value = getattr(ns, name)
        if value is None:
            continue
        if kind is int:
            try:
                value = int(value)
            except ValueError:
                raise CaptureSpecError(f"SGLang args: --{name.replace('_', '-')} {value!r} is not an integer") from None
        out[name] = value
    return out


def sglang_findings(args: Mapping[str, Any], draft_path: Path | None = None) -> list[Finding]:
    """SGLang speculative settings that override or contradict each other (rules of SGLang 0.5.23
    ``srt/arg_groups/speculative_hook.py`` ``_handle_eagle_family``; older releases had the same in server_args)."""
    out: list[Finding] = []
    algo = args.get("speculative_algorithm")
    steps, topk, ndraft = (
        args.get(k) for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    )
    if algo is not None and algo.upper() != "EAGLE3":
        out.append(
            Finding(
                "algorithm",
                (
                    f"--speculative-algorithm {algo}: SGLang captures aux hidden states only for EAGLE3; an EAGLE-3 "
                    "head "
                    "served this way gets the last hidden state instead of its taps. Use --speculative-algorithm EAGLE3"
                ),
            )
        )
    if steps is None and (topk is not None or ndraft is not None):
        given = ", ".join(
            f"--{k.replace('_', '-')} {args[k]}"
            for k in ("speculative_eagle_topk", "speculative_num_draft_tokens")
            if args.get(k) is not None
        )
        out.append(
            Finding(
                "spec-assert",
                (
                    f"{given} without --speculative-num-steps: SGLang picks all three itself only when none is "
                    "given and "
                    "asserts otherwise; give --speculative-num-steps too"
                ),
            )
        )
    if steps is not None and ndraft is not None and ndraft != steps + 1 and topk in (None, 1):
        cond = (
            "--speculative-eagle-topk 1"
            if topk == 1
            else "--speculative-eagle-topk 1 (if it resolves to 1: it is not given)"
        )
        out.append(
            Finding(
                "spec-override",
                (
                    f"--speculative-num-draft-tokens {ndraft} is silently replaced by --speculative-num-steps + 1 = "
                    f"{steps + 1} under {cond}: a chain drafts num_steps tokens and verifies num_steps + 1 (the "
                    "incident's "
                    f"'--speculative-num-steps 1' capped 16 draft tokens at 2). To draft {ndraft - 1} tokens in a "
                    "chain "
                    f"set --speculative-num-steps {ndraft - 1}; "
                    f"to verify a tree of {ndraft} set --speculative-eagle-topk > 1"
                ),
            )
        )
    if args.get("enable_two_batch_overlap"):
        out.append(
            Finding(
                "tbo",
                (
                    "--enable-two-batch-overlap: SGLang's two-batch overlap silently misses aux ids >= "
                    "first_k_dense_replace on the DeepSeek path; check the acceptance with and without it"
                ),
            )
        )
    dm = args.get("speculative_draft_model_path")
    if dm is not None and draft_path is not None:
        try:
            same = Path(dm).resolve() == Path(draft_path).resolve()
        except OSError:
            same = False
        if not same:
            out.append(
                Finding(
                    "draft-path",
                    (
                        f"--speculative-draft-model-path {dm} is not the draft inspected here ({draft_path}); the "
                        "checks "
                        "above are about the latter"
                    ),
                )
            )
    return out
