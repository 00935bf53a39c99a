"""Byte-level BPE tokenizer of the miniature, with Kimi K2.5's chat and media special tokens.

Where it sits: trained once on the training split (data.py), saved next to the target weights as
``tokenizer.json`` + ``tokenizer_config.json`` (a ``PreTrainedTokenizerFast`` with a small Kimi-style
chat template), loaded by transformers and by vLLM unchanged. Kimi's media tokens matter to vLLM:
``KimiK25ProcessingInfo`` resolves ``<|media_pad|>`` through the tokenizer and uses it as
``image_token_id`` / ``media_placeholder_token_id``.

Only the ``tokenizers`` package is needed to train and save (the GPU machine has no vLLM).

CLI: ``python -m vllm_eagle3.miniature.tokenizer --out DIR [--vocab-size 4096]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

BOS = "[BOS]"
EOS = "[EOS]"  # also the end-of-file separator of the training stream
PAD = "[PAD]"
MEDIA_PAD = "<|media_pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS,
    EOS,
    PAD,
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    MEDIA_PAD,
    "<|kimi_k25_video_placeholder|>",
)

# Kimi-style template: <|im_{role}|>{role}<|im_middle|>{content}<|im_end|>; image parts become Kimi's
# media placeholder so vLLM's multimodal processor finds <|media_pad|>.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- else -%}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train_tokenizer(texts: Sequence[str], vocab_size: int = 4096):
    """Train a byte-level BPE (``tokenizers.Tokenizer``) whose first ids are ``SPECIAL_TOKENS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 512:
        raise ValueError(f"vocab_size={vocab_size} is too small for byte-level BPE (256 bytes + specials); use >= 512")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out_dir: Path, model_max_length: int = 4096) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (PreTrainedTokenizerFast + chat template)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_tokenizer(model_dir: Path):
    """The raw ``tokenizers.Tokenizer`` of a saved miniature (no transformers needed)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found; train one with python -m vllm_eagle3.miniature.tokenizer --out {model_dir}"
        )
    return Tokenizer.from_file(str(path))


def special_ids(tok) -> dict[str, int]:
    """Ids of the special tokens (``tok.token_to_id`` for each of ``SPECIAL_TOKENS``)."""
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def main(argv: Sequence[str] | None = None) -> None:
    from . import data

    ap = argparse.ArgumentParser(description="Train the miniature's byte-level BPE on Python sources and save it.")
    ap.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json + tokenizer_config.json")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-chars", type=int, default=5_000_000, help="characters of training text to learn merges from")
    ap.add_argument(
        "--roots", nargs="*", type=Path, default=None, help="source folders (default: stdlib + site-packages)"
    )
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    args = ap.parse_args(argv)
    train, _ = data.split_files(data.source_files(args.roots or data.default_roots()), args.heldout_fraction)
    tok = train_tokenizer(data.read_texts(train, args.max_chars), args.vocab_size)
    save_tokenizer(tok, args.out)
    print(f"saved tokenizer ({tok.get_vocab_size()} tokens) to {args.out}")


if __name__ == "__main__":
    main()
