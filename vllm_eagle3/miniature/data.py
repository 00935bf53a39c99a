"""Training text for the miniature: Python source files found on the machine, split by file.

Where it sits: first step of the miniature pipeline. ``source_files`` lists ``*.py`` files under some
roots (default: this interpreter's standard library and site-packages), ``split_files`` puts each file
into train or held-out by a hash of its path relative to its root (stable across machines with the
same files, independent of listing order), ``encode_files`` turns files into one token stream with an
end-of-text token between files, and ``random_windows`` draws training batches from that stream.

Training mix (``load_training_mix``): the standard library (every training-split file under the stdlib
root that is not in a site-/dist-packages folder: clean, idiomatic Python, and what the held-out windows
are made of, since held-out files are read in sorted order) and third-party sources (site-packages, read
in a hash-shuffled order so a character cap samples many packages, not the alphabetically first ones,
and filtered by ``looks_like_code``: no generated tables, serialized blobs or minified lines). Files
with identical text are kept once. A batch row comes from the stdlib with probability ``stdlib_weight``.

CLI: ``python -m vllm_eagle3.miniature.data --help`` prints corpus statistics.
"""

from __future__ import annotations

import argparse
import hashlib
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from .schedule import progress_text


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
            raise FileNotFoundError(f"source root {root} is not a directory; pass existing folders with --roots")
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


def is_stdlib(f: SourceFile) -> bool:
    """True for standard-library files: not inside a ``site-packages`` / ``dist-packages`` folder."""
    return not ({"site-packages", "dist-packages"} & set(f.path.parts))


def looks_like_code(
    text: str,
    max_mean_line: float = 60.0,
    max_line: int = 1000,
    max_digit_frac: float = 0.2,
    max_non_ascii: float = 0.05,
) -> bool:
    """False for files that are data rather than code: long mean or max lines (serialized protobufs, minified
    or generated tables), many digits (numeric tables), non-ASCII text (unicode tables)."""
    lines = text.splitlines()
    if not lines:
        return False
    n = len(text)
    if n / len(lines) > max_mean_line or max(len(line) for line in lines) > max_line:
        return False
    digits = sum(map(text.count, "0123456789"))
    non_ascii = 0 if text.isascii() else len(text) - len(text.encode("ascii", "ignore"))
    return digits / n <= max_digit_frac and non_ascii / n <= max_non_ascii


def read_unique_texts(
    files: Iterable[SourceFile], max_chars: int, keep=None, seen: set[str] | None = None
) -> list[str]:
    """Like :func:`read_texts`, skipping texts already in ``seen`` (sha1, updated) and texts ``keep`` rejects."""
    seen = set() if seen is None else seen
    texts: list[str] = []
    total = 0
    for f in files:
        if total >= max_chars:
            break
        try:
            t = f.path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha1(t.encode()).hexdigest()
        if not t.strip() or digest in seen or (keep is not None and not keep(t)):
            continue
        seen.add(digest)
        texts.append(t)
        total += len(t)
    return texts


@dataclass(frozen=True)
class TrainingMix:
    """Two token streams and the share of batch rows drawn from the first (the standard library)."""

    stdlib: torch.Tensor
    other: torch.Tensor
    stdlib_weight: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.stdlib_weight <= 1.0:
            raise ValueError(f"stdlib_weight={self.stdlib_weight} must lie in [0, 1], e.g. 0.5")

    @property
    def tokens(self) -> torch.Tensor:
        """Both streams, concatenated (for token statistics such as the draft vocabulary)."""
        return torch.cat([self.stdlib, self.other])

    def windows(self, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
        """``[batch, seq_len]`` windows; each row from the stdlib with probability ``stdlib_weight`` (an
        empty or too-short stream gives all rows to the other)."""
        ok_std, ok_other = self.stdlib.numel() > seq_len, self.other.numel() > seq_len
        w = self.stdlib_weight if ok_std and ok_other else float(ok_std)
        n_std = int((torch.rand(batch, generator=generator) < w).sum())
        parts = []
        if n_std:
            parts.append(random_windows(self.stdlib, n_std, seq_len, generator))
        if batch - n_std:
            parts.append(random_windows(self.other, batch - n_std, seq_len, generator))
        ids = torch.cat(parts)
        return ids[torch.randperm(batch, generator=generator).to(ids.device)]

    def to(self, device) -> "TrainingMix":
        """The same mix with both streams on ``device`` (windows are then cut there)."""
        return TrainingMix(self.stdlib.to(device), self.other.to(device), self.stdlib_weight)


def load_training_mix(
    tok, train_files: Sequence[SourceFile], eot_id: int, stdlib_chars: int, other_chars: int, stdlib_weight: float
) -> tuple[TrainingMix, dict[str, int]]:
    """The training mix of ``train_files`` (see the module docstring) and its statistics."""
    std = [f for f in train_files if is_stdlib(f)]
    other = sorted((f for f in train_files if not is_stdlib(f)), key=lambda f: hashlib.sha1(f.rel.encode()).hexdigest())
    seen: set[str] = set()
    std_texts = read_unique_texts(std, stdlib_chars, seen=seen)
    other_texts = read_unique_texts(other, other_chars, keep=looks_like_code, seen=seen)
    mix = TrainingMix(
        encode_texts(tok, std_texts, eot_id) if std_texts else torch.zeros(0, dtype=torch.int32),
        encode_texts(tok, other_texts, eot_id) if other_texts else torch.zeros(0, dtype=torch.int32),
        stdlib_weight,
    )
    stats = {
        "stdlib_files": len(std_texts),
        "stdlib_chars": sum(map(len, std_texts)),
        "stdlib_tokens": mix.stdlib.numel(),
        "other_files": len(other_texts),
        "other_chars": sum(map(len, other_texts)),
        "other_tokens": mix.other.numel(),
    }
    return mix, stats


def cached_training_mix(
    cache: Path | None,
    tok,
    train_files: Sequence[SourceFile],
    eot_id: int,
    stdlib_chars: int,
    other_chars: int,
    stdlib_weight: float,
) -> tuple[TrainingMix, dict[str, int]]:
    """:func:`load_training_mix`, kept in ``cache`` (a torch file) when given: a second run (a resumed target,
    the heads) skips reading and tokenizing. The cache records its arguments and is rebuilt when they differ."""
    key = {
        "stdlib_chars": stdlib_chars,
        "other_chars": other_chars,
        "files": len(train_files),
        "vocab": tok.get_vocab_size(),
    }
    if cache is not None and Path(cache).exists():
        saved = torch.load(cache, weights_only=False)
        if saved["key"] == key:
            print(f"[data] tokenized training mix read from {cache}", flush=True)
            return TrainingMix(saved["stdlib"], saved["other"], stdlib_weight), saved["stats"]
    print(
        f"[data] reading up to {stdlib_chars / 1e6:.0f} M standard-library and {other_chars / 1e6:.0f} M other "
        f"characters of {len(train_files):,} files and tokenizing them"
        + ("" if cache else " (minutes; --data-cache keeps the result for the next run)"),
        flush=True,
    )
    t0 = time.time()
    mix, stats = load_training_mix(tok, train_files, eot_id, stdlib_chars, other_chars, stdlib_weight)
    print(
        f"[data] training mix: {stats['stdlib_tokens'] + stats['other_tokens']:,} tokens in {time.time() - t0:.0f} s",
        flush=True,
    )
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": key, "stdlib": mix.stdlib, "other": mix.other, "stats": stats}, cache)
    return mix, stats


def encode_texts(tokenizer, texts: Sequence[str], eot_id: int) -> torch.Tensor:
    """One flat int32 token stream: each text's tokens followed by ``eot_id``. Tokenized in tenths, each printed
    with the share done and the time left (a full corpus takes minutes)."""
    texts = list(texts)
    chars = sum(map(len, texts)) or 1
    ids: list[int] = []
    t0, done, step = time.time(), 0, max(1, len(texts) // 10)
    for start in range(0, len(texts), step):
        chunk = texts[start : start + step]
        for e in tokenizer.encode_batch(chunk, add_special_tokens=False):
            ids.extend(e.ids)
            ids.append(eot_id)
        done += sum(map(len, chunk))
        if len(texts) > step:
            print(
                f"[data] tokenizing {len(texts):,} files: {progress_text(done / chars, time.time() - t0)}", flush=True
            )
    return torch.tensor(ids, dtype=torch.int32)


def random_windows(stream: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``[batch, seq_len]`` int64 windows at random offsets of ``stream``."""
    if stream.numel() <= seq_len:
        raise ValueError(
            f"token stream of {stream.numel()} tokens is shorter than seq_len={seq_len}; "
            "read more text (--max-chars) or lower --seq-len"
        )
    starts = torch.randint(0, stream.numel() - seq_len, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len)[None, :]
    return stream[idx.to(stream.device)].long()


def fixed_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping ``[n, seq_len]`` windows from the start of ``stream`` (evaluation)."""
    n = min(max_windows, stream.numel() // seq_len)
    if n == 0:
        raise ValueError(f"held-out stream ({stream.numel()} tokens) is shorter than one window of {seq_len}")
    return stream[: n * seq_len].view(n, seq_len).long()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Show the Python-source corpus and its train/held-out split.")
    ap.add_argument(
        "--roots", nargs="*", type=Path, default=None, help="folders to scan (default: stdlib + site-packages)"
    )
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    args = ap.parse_args(argv)
    files = source_files(args.roots or default_roots())
    train, held = split_files(files, args.heldout_fraction)
    size = lambda fs: sum(f.path.stat().st_size for f in fs)  # noqa: E731
    print(
        f"{len(files)} files; train {len(train)} ({size(train) / 1e6:.1f} MB), "
        f"held-out {len(held)} ({size(held) / 1e6:.1f} MB)"
    )


if __name__ == "__main__":
    main()
