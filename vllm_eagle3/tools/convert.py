"""``vllm-eagle3 convert``: rewrite a draft config's aux-layer ids from one engine convention to another.

Data flow position: none at run time. This edits the draft's ``config.json`` so that the ids every engine reads
(``target forward -> taps -> concat -> draft fc``) name the taps the draft was trained on. The translation goes through
taps (:func:`vllm_eagle3.conventions.convert_ids`); this module adds no offsets of its own.

What is written, and why both lists:
- top-level ``eagle_aux_hidden_state_layer_ids``: the only list vLLM's V2 runner reads;
- ``eagle_config.eagle_aux_hidden_state_layer_ids``: the only list SGLang reads (and vLLM's V1 fallback);
- ``num_aux_hidden_states``: vLLM sizes the draft's ``fc`` from it (else from the nested list, else 3).

What cannot be expressed is refused with the reason, from the engine's own source (SpecForge and TorchSpec have no
id for the embedding tap; SpecForge takes exactly three ids; SGLang 0.5.23 cannot capture the final pre-norm state;
SGLang 0.5.12.post1 names any number of taps but serves three only). SGLang 0.5.23 takes any count: its capture
packer, the draft's ``fc`` and its draft-extend buffers are all sized from the draft's list.
The converted config's EAGLE-3.1 options and fan-in are then read as each engine reads them
(:func:`vllm_eagle3.checkpoint.draft_option_warnings`): one warning line per option an engine would ignore or read
differently, naming the engine and version. Nothing is written on failure: the output goes to a temporary file in the
destination folder, renamed over the target only once complete.

    vllm-eagle3 convert --from sglang-legacy --to vllm --num-layers 61 draft/config.json -o /tmp/config.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from vllm_eagle3.conventions import CONVENTIONS, convert_ids, get_convention, ids_to_taps
from vllm_eagle3.checkpoint import IDS_KEY, TRAINED_KEY, DraftInfo, TargetInfo, draft_option_warnings, read_json
from vllm_eagle3.spec import CaptureSpec, CaptureSpecError


def source_ids(draft: DraftInfo, which: str = "auto") -> tuple[tuple[int, ...], str]:
    """The id list to convert and where it was found ("top-level" or "eagle_config").

    ``which`` is "auto" (the one list present, or both when equal), "top" or "nested". Two different lists under
    "auto" are refused: which one the draft was trained on cannot be told from the file.
    """
    top, nested = draft.top_ids, draft.nested_ids
    if which == "top":
        if top is None:
            raise CaptureSpecError(f"the draft config has no top-level {IDS_KEY}; drop --ids-from top")
        return top, "top-level"
    if which == "nested":
        if nested is None:
            raise CaptureSpecError(f"the draft config has no eagle_config.{IDS_KEY}; drop --ids-from nested")
        return nested, "eagle_config"
    if top is None and nested is None:
        raise CaptureSpecError(
            f"the draft config has no {IDS_KEY} (neither top-level nor in eagle_config), so there is nothing to "
            "convert; the engines would use their defaults. Write the ids the draft was trained on first "
            "(`vllm-eagle3 doctor` measures them)"
        )
    if top is not None and nested is not None and tuple(top) != tuple(nested):
        raise CaptureSpecError(
            f"the draft config has two different id lists: top-level {list(top)} and eagle_config {list(nested)}; "
            "say which one to convert with --ids-from top|nested"
        )
    return (top, "top-level") if top is not None else (nested, "eagle_config")


def convert_config(
    config: Mapping[str, Any], src: str, dst: str, num_layers: int, which: str = "auto"
) -> tuple[dict, str]:
    """Return (new config, one-line summary). The input mapping is not modified."""
    src_c, dst_c = get_convention(src), get_convention(dst)
    draft = DraftInfo.from_config(config)
    ids, where = source_ids(draft, which)
    taps = ids_to_taps(ids, src_c.name, num_layers)
    spec = CaptureSpec(taps=taps, source=f"{where} ids {list(ids)} read as {src_c.name}")
    try:
        new_ids = list(convert_ids(ids, src_c.name, dst_c.name, num_layers))
    except CaptureSpecError as exc:
        raise CaptureSpecError(f"cannot write taps {spec.label()} in the {dst_c.name} convention: {exc}") from None
    n_aux = config.get("num_aux_hidden_states")
    if n_aux is not None and n_aux != len(new_ids):
        raise CaptureSpecError(
            f"the draft config says num_aux_hidden_states = {n_aux!r} but its ids {list(ids)} name {len(ids)} taps; "
            "fix whichever is wrong first (the draft's fc.weight has num_taps x target_hidden_size inputs)"
        )
    out = copy.deepcopy(dict(config))
    out[IDS_KEY] = new_ids
    nested = dict(out.get("eagle_config") or {})
    nested[IDS_KEY] = list(new_ids)
    out["eagle_config"] = nested
    out["num_aux_hidden_states"] = len(new_ids)
    summary = (
        f"{where} ids {list(ids)} ({src_c.name}) = taps {spec.label()} -> {dst_c.name} ids {new_ids} "
        f"(written top-level and in eagle_config; num_aux_hidden_states = {len(new_ids)})"
    )
    if dst_c.concat_order == "ascending" and list(taps) != sorted(taps):
        summary += (
            f"; NOTE: {dst_c.name} concatenates in ascending tap order, not the listed order "
            f"{spec.label()}: serve with a capture spec (vllm-eagle3) to keep the draft's order"
        )
    return out, summary


def rewired_copy(draft: Path, out_dir: Path, ids: list[int]) -> Path:
    """A copy of the draft folder (weights and other files symlinked) whose config names ``ids`` at the top level
    and in ``eagle_config``, without the trainer's record of its taps (``vllm_eagle3``): the same head wired
    otherwise (e.g. on the engine default taps). For tests and benchmarks."""
    cfg = json.loads((Path(draft) / "config.json").read_text())
    cfg[IDS_KEY] = list(ids)
    if isinstance(cfg.get("eagle_config"), dict):
        cfg["eagle_config"][IDS_KEY] = list(ids)
    cfg.pop(TRAINED_KEY, None)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in Path(draft).iterdir():
        if f.name != "config.json" and f.is_file() and not (out_dir / f.name).exists():
            (out_dir / f.name).symlink_to(f.resolve())
    return out_dir


def write_json_atomic(path: Path, data: Mapping[str, Any], mode_from: Path | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder; ``path`` is untouched on failure."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise CaptureSpecError(f"output {path} is a folder; give a file name such as {path / 'config.json'}")
    if not folder.is_dir():
        raise CaptureSpecError(f"output folder {folder} does not exist; create it first")
    text = json.dumps(data, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode_from is not None and mode_from.exists():
            os.chmod(tmp, mode_from.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def num_layers_from_args(num_layers: int | None, target: str | None) -> int:
    if num_layers is not None and target is not None:
        raise CaptureSpecError("give either --num-layers or --target, not both")
    if target is not None:
        return TargetInfo.load(target).num_layers
    if num_layers is None:
        raise CaptureSpecError(
            "the target's layer count is needed (defaults and range checks depend on it): pass --num-layers N or "
            "--target DIR (the target model folder with config.json)"
        )
    if num_layers < 1:
        raise CaptureSpecError(f"--num-layers must be a positive integer, got {num_layers}")
    return num_layers


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(CONVENTIONS)
    p = argparse.ArgumentParser(
        prog="vllm-eagle3 convert",
        description="Translate a draft config's eagle_aux_hidden_state_layer_ids from one engine convention to "
        "another (through taps: tap k = hidden state entering decoder layer k, embed = 0). Writes the "
        "top-level and the nested eagle_config lists and num_aux_hidden_states; refuses what the target "
        "convention cannot express. Without -o/--in-place the new config is printed.",
        epilog=f"conventions: {names}. Example: vllm-eagle3 convert --from sglang-legacy --to vllm "
        "--num-layers 61 draft/config.json -o draft/config.vllm.json",
    )
    p.add_argument("config", help="the draft's config.json")
    p.add_argument("--from", dest="src", required=True, metavar="CONV", help="convention the ids are written in")
    p.add_argument("--to", dest="dst", required=True, metavar="CONV", help="convention to write")
    p.add_argument("--num-layers", type=int, default=None, help="the target's decoder layer count")
    p.add_argument("--target", default=None, help="target model folder (its config.json gives the layer count)")
    p.add_argument(
        "--ids-from",
        choices=("auto", "top", "nested"),
        default="auto",
        help="which id list to convert when both exist (default: auto, refuses two different lists)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", default=None, help="write the converted config here")
    out.add_argument("--in-place", action="store_true", help="overwrite the input config")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        num_layers = num_layers_from_args(args.num_layers, args.target)
        src = Path(args.config)
        config = read_json(src, "draft config")
        new, summary = convert_config(config, args.src, args.dst, num_layers, args.ids_from)
        for _, warning in draft_option_warnings(new):
            print(f"vllm-eagle3 convert: warning: {warning}", file=sys.stderr)
        if args.in_place:
            write_json_atomic(src, new, mode_from=src)
            print(f"vllm-eagle3 convert: {summary}; rewrote {src}", file=sys.stderr)
        elif args.output:
            write_json_atomic(Path(args.output), new)
            print(f"vllm-eagle3 convert: {summary}; wrote {args.output}", file=sys.stderr)
        else:
            print(f"vllm-eagle3 convert: {summary}", file=sys.stderr)
            print(json.dumps(new, indent=2))
    except CaptureSpecError as exc:
        print(f"vllm-eagle3 convert: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(
            f"vllm-eagle3 convert: error: {exc.strerror or exc} ({exc.filename or ''}); nothing was written",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
