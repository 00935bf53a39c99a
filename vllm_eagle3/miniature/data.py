"""Training text for the miniature: Python source files found on the machine, split by file.

Where it sits: first step of the miniature pipeline. ``source_files`` lists ``*.py`` files under some
roots (default: this interpreter's standard library and site-packages), ``split_files`` puts each file
into train or held-out by a hash of its path relative to its root (stable across machines with the
same files, independent of listing order), ``encode_files`` turns files into one token stream with an
end-of-text token between files, and ``random_windows`` draws training batches from that stream.

CLI: ``python -m vllm_eagle3.miniature.data --help`` prints corpus statistics.
"""

from __future__ import annotations

import argparse
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch


def default_roots() -> list[Path]:
    """The standard library and site-packages of the running interpreter (real Python text)."""
    paths = sysconfig.get_paths()
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        p = Path(paths[key])
        if p.is_dir() and p not in roots:
            roots.append(p)
    return roots


@dataclass(frozen=True)
class SourceFile:
    """One Python file: its path and its path relative to the root it was found under."""

    path: Path
    rel: str


def source_files(roots: Sequence[Path], max_file_bytes: int = 200_000) -> list[SourceFile]:
    """All ``*.py`` files under ``roots`` (sorted, deduplicated, files over ``max_file_bytes`` skipped)."""
    seen: set[Path] = set()
    out: list[SourceFile] = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(
                f"source root {root} is not a directory; pass existing folders with --roots"
            )
        for p in sorted(root.rglob("*.py")):
            try:
                real = p.resolve()
                size = real.stat().st_size
            except OSError:
                continue
            if real in seen or size == 0 or size > max_file_bytes:
                continue
            seen.add(real)
            out.append(SourceFile(p, p.relative_to(root).as_posix()))
    return out


def is_heldout(rel: str, heldout_fraction: float) -> bool:
    """True when the file goes to the held-out split (hash of its relative path)."""
    h = int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16)
    return (h % 10_000) < heldout_fraction * 10_000


def split_files(
    files: Sequence[SourceFile], heldout_fraction: float = 0.02
) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, heldout) split by file, so held-out text never appears in training."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction} must lie in (0, 1), e.g. 0.02")
    train = [f for f in files if not is_heldout(f.rel, heldout_fraction)]
    held = [f for f in files if is_heldout(f.rel, heldout_fraction)]
    return train, held


def read_texts(files: Iterable[SourceFile], max_chars: int) -> list[str]:
    """Texts of ``files`` in order until ``max_chars`` characters are collected."""
    texts: list[str] = []
    total = 0
    for f in files:
        try:
            t = f.path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not t.strip():
            continue
        texts.append(t)
        total += len(t)
        if total >= max_chars:
            break
    return texts


def encode_texts(tokenizer, texts: Sequence[str], eot_id: int) -> torch.Tensor:
    """One flat int32 token stream: each text's tokens followed by ``eot_id``."""
    encs = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    ids: list[int] = []
    for e in encs:
        ids.extend(e.ids)
        ids.append(eot_id)
    return torch.tensor(ids, dtype=torch.int32)


def random_windows(
    stream: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch, seq_len]`` int64 windows at random offsets of ``stream``."""
    if stream.numel() <= seq_len:
        raise ValueError(
            f"token stream of {stream.numel()} tokens is shorter than seq_len={seq_len}; "
            "read more text (--max-chars) or lower --seq-len"
        )
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len)[None, :]
    return stream[idx].long()


def fixed_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping ``[n, seq_len]`` windows from the start of ``stream`` (evaluation)."""
    n = min(max_windows, stream.numel() // seq_len)
    if n == 0:
        raise ValueError(f"held-out stream ({stream.numel()} tokens) is shorter than one window of {seq_len}")
    return stream[: n * seq_len].view(n, seq_len).long()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Show the Python-source corpus and its train/held-out split.")
    ap.add_argument("--roots", nargs="*", type=Path, default=None, help="folders to scan (default: stdlib + site-packages)")
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    args = ap.parse_args(argv)
    files = source_files(args.roots or default_roots())
    train, held = split_files(files, args.heldout_fraction)
    size = lambda fs: sum(f.path.stat().st_size for f in fs)  # noqa: E731
    print(f"{len(files)} files; train {len(train)} ({size(train) / 1e6:.1f} MB), held-out {len(held)} ({size(held) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
