"""Prompts no shipped model ever trained on, for the benchmarks (``bench/heldout_prompts.json``; why, and the two
checks: docs/adaptive-k.md, "Prompts the heads never saw"; the heads were tuned looking at their eval prompts, too).
Files in the order of a hash of their path. CLI: ``python -m vllm_eagle3.tools.bench.heldout``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

from vllm_eagle3.tools import REPO, bundled

DEFAULT_AFTER = "7a77e1d"  # "Default head: the norm_output candidate ..." - the last commit that changed a model
DEFAULT_OUT = "bench/heldout_prompts.json"
TOKENIZER_DIR = "models/kimi-k25-mini"
RUN = 3  # consecutive non-blank lines that, found together in the corpus, mark a prompt as seen


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def files_added_after(after: str, under: Sequence[str] = ("vllm_eagle3", "model_patches", "tests")) -> list[str]:
    """Python files (as they are at HEAD) whose first commit comes after ``after`` (renames are not additions)."""
    added = git("log", "--diff-filter=A", "-M", "--name-only", "--format=", f"{after}..HEAD", "--", *under).split()
    alive = set(git("ls-files", "--", *under).split())
    return sorted({p for p in added if p.endswith(".py") and p in alive})


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def runs_of(text: str, n: int = RUN) -> set[tuple[str, ...]]:
    ls = _lines(text)
    return {tuple(ls[i : i + n]) for i in range(len(ls) - n + 1)}


def windows(tok, text: str, prompt_tokens: int, per_file: int) -> list[tuple[int, list[int]]]:
    """Up to ``per_file`` (line number, token ids) windows of exactly ``prompt_tokens`` tokens starting at line
    starts, evenly spread through the file (none overlapping)."""
    lines = text.splitlines(keepends=True)
    starts, off = [], 0
    for i, ln in enumerate(lines):
        if ln.strip():
            starts.append((i, off))
        off += len(ln)
    out: list[tuple[int, list[int]]] = []
    next_char = 0
    step = max(1, len(starts) // max(per_file, 1))
    for lineno, char in starts[::step]:
        if len(out) >= per_file:
            break
        if char < next_char:
            continue
        ids = tok.encode(text[char : char + 40 * prompt_tokens]).ids
        if len(ids) < prompt_tokens:
            continue
        ids = ids[:prompt_tokens]
        out.append((lineno + 1, ids))
        next_char = char + len(tok.decode(ids))
    return out


def corpus_hits(prompts: Iterable[str], roots: Sequence[Path], progress: bool = True) -> tuple[list[bool], int]:
    """For each prompt text, whether RUN of its consecutive non-blank lines occur together in a file under
    ``roots``; and how many files were read."""
    from tqdm import tqdm

    from vllm_eagle3.miniature.data import source_files

    texts = list(prompts)
    wanted: dict[tuple[str, ...], list[int]] = {}
    for i, t in enumerate(texts):
        for r in runs_of(t):
            wanted.setdefault(r, []).append(i)
    hit = [False] * len(texts)
    firsts = {r[0] for r in wanted}
    files = source_files(roots)
    for f in tqdm(files, desc="corpus check", unit="file", disable=not progress):
        try:
            ls = _lines(f.path.read_text(encoding="utf-8", errors="ignore"))
        except OSError:
            continue
        for j, ln in enumerate(ls):
            if ln in firsts:
                for i in wanted.get(tuple(ls[j : j + RUN]), ()):
                    hit[i] = True
    return hit, len(files)


def build(
    after: str, n: int, prompt_tokens: int, per_file: int, roots: Sequence[Path] | None = None, progress: bool = True
) -> dict:
    from vllm_eagle3.miniature.data import default_roots
    from vllm_eagle3.miniature.tokenizer import load_tokenizer

    tok = load_tokenizer(bundled(TOKENIZER_DIR, "bench"))
    head = git("rev-parse", "--short", "HEAD").strip()
    files = sorted(files_added_after(after), key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    cands = []
    for path in files:
        text = (REPO / path).read_text(encoding="utf-8")
        for lineno, ids in windows(tok, text, prompt_tokens, per_file):
            cands.append({"prompt_token_ids": ids, "prompt": tok.decode(ids), "source": f"{path}:{lineno}"})
    roots = list(roots or default_roots())
    hits, n_files = corpus_hits([c["prompt"] for c in cands], roots, progress)
    kept = [c for c, h in zip(cands, hits) if not h]
    # round-robin over files, so that the first prompts (what a small cell uses) come from many files
    by_file: dict[str, list[dict]] = {}
    for c in kept:
        by_file.setdefault(c["source"].rsplit(":", 1)[0], []).append(c)
    items = [c for row in itertools.zip_longest(*by_file.values()) for c in row if c][:n]
    if len(items) < n:
        raise SystemExit(
            f"only {len(items)} held-out prompts of {prompt_tokens} tokens (asked for {n}); "
            f"raise --per-file or lower --prompts"
        )
    return {
        "note": (
            f"{len(items)} prompts of {prompt_tokens} tokens from this repository's Python files added after "
            f"commit {after} (the last commit that changed a shipped model), at commit {head}; none has {RUN} "
            f"consecutive non-blank lines found together in the {n_files} *.py files under the trainer's default "
            f"roots. Written by python -m vllm_eagle3.tools.bench.heldout."
        ),
        "checks": {
            "after": after,
            "commit": head,
            "source_files": len(files),
            "candidates": len(cands),
            "dropped_seen_in_corpus": sum(hits),
            "corpus_roots": [str(r) for r in roots],
            "corpus_files": n_files,
            "run_lines": RUN,
            "prompt_tokens": prompt_tokens,
        },
        "items": items,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm_eagle3.tools.bench.heldout",
        description="Write benchmark prompts no shipped model trained on: windows of this "
        "repository's Python files added after the last model commit, each "
        "checked against the trainer's corpus roots.",
    )
    p.add_argument("--after", default=DEFAULT_AFTER, help=f"the last commit that changed a model ({DEFAULT_AFTER})")
    p.add_argument("--prompts", type=int, default=256, help="how many (a c=64 cell of 2 waves uses 128)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="tokens per prompt (64, as the eval prompts)")
    p.add_argument("--per-file", type=int, default=12, help="at most this many windows per file")
    p.add_argument(
        "--roots",
        nargs="*",
        type=Path,
        default=None,
        help="corpus roots to check against (default: this interpreter's stdlib and site-packages)",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"({DEFAULT_OUT})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    data = build(args.after, args.prompts, args.prompt_tokens, args.per_file, args.roots)
    out = Path(args.out)
    out = out if out.is_absolute() else REPO / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    c = data["checks"]
    print(
        f"{out}: {len(data['items'])} prompts from {c['source_files']} files ({c['candidates']} windows, "
        f"{c['dropped_seen_in_corpus']} dropped: seen in {c['corpus_files']} corpus files)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
