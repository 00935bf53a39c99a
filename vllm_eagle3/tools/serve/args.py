"""Reading a ``vllm serve`` command line the way vLLM will, without importing vLLM (which costs 10-18 s).

Data flow position: before the engine. ``serve.py`` needs five things from vLLM's options to validate statically
in ~0.1 s: the target model, the speculative config (JSON, dotted ``--speculative-config.model`` or the
``--spec-*`` shorthands), the additional config (where the capture spec travels), the pipeline-parallel size and
whether the user chose a memory setting. vLLM's own
``FlexibleArgumentParser`` + ``make_arg_parser`` would need ``import vllm``; this module reads the same options
with vLLM's precedence (CLI over ``--config serve.yaml``; last occurrence wins; dashes and underscores alike), and
tests/unit/test_serve_args.py checks it against vLLM's parser on the same command lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3.spec import CaptureSpecError


class ServeInputError(CaptureSpecError):
    """A serve command line or serve config that cannot be validated; the message says what to fix."""


# ------------------------------------------------------------------------------------------- argv handling


def take_option(argv: list[str], names: Sequence[str]) -> tuple[str | None, list[str]]:
    """Remove ``--name VALUE`` / ``--name=VALUE`` (any of ``names``) from argv; the last one wins."""
    value, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        hit = next((n for n in names if arg == n or arg.startswith(n + "=")), None)
        if hit is None:
            rest.append(arg)
            i += 1
            continue
        if arg == hit:
            if i + 1 >= len(argv):
                raise ServeInputError(f"{hit} needs a value")
            value, i = argv[i + 1], i + 2
        else:
            value, i = arg[len(hit) + 1 :], i + 1
    return value, rest


def _norm(key: str) -> str:
    return key.lstrip("-").replace("_", "-")


def _find_option(argv: Sequence[str], name: str, short: str | None = None) -> str | None:
    """The value of vLLM option ``--name`` in argv (dashes/underscores alike, ``=`` form too); last one wins."""
    value = None
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        key, eq, val = arg.partition("=")
        if _norm(key) == name or (short and key == short):
            if eq:
                value = val
            elif i + 1 < len(argv):
                value = argv[i + 1]
    return value


def _dotted_options(argv: Sequence[str], name: str) -> dict[str, Any]:
    """vLLM's dotted form ``--speculative-config.model X`` -> ``{"model": "X"}`` (values parsed as JSON if possible)."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(argv):
        key, eq, val = arg.partition("=")
        if not key.startswith("--") or "." not in key or _norm(key.split(".", 1)[0]) != name:
            continue
        field = key.split(".", 1)[1].replace("-", "_")
        raw = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            out[field] = json.loads(raw)
        except json.JSONDecodeError:
            out[field] = raw
    return out


def _load_serve_config(path: str) -> dict[str, Any]:
    """vLLM's ``--config`` YAML, keys normalised to dashes."""
    import yaml

    p = Path(path)
    if p.suffix not in (".yaml", ".yml"):
        raise ServeInputError(f"--config {path}: vLLM reads only .yaml/.yml serve configs")
    if not p.is_file():
        raise ServeInputError(
            f"--config {path} does not exist; pass a serve YAML such as configs/serve_kimi_k25_mini.yaml"
        )
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ServeInputError(f"--config {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ServeInputError(f"--config {path} must be a mapping of vLLM options, got {type(data).__name__}")
    return {_norm(str(k)): v for k, v in data.items()}


def _as_spec_dict(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    try:
        data = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ServeInputError(
            f"{where} is not valid JSON ({exc}); write it like "
            '\'{"method": "eagle3", "model": "DRAFT", '
            '"num_speculative_tokens": 3}\''
        ) from None
    if not isinstance(data, dict):
        raise ServeInputError(f"{where} must be a JSON object, got {data!r}")
    return data


def serve_target_and_draft(vllm_argv: Sequence[str]) -> tuple[str | None, dict[str, Any] | None]:
    """``(model, speculative config dict or None)`` as vLLM will see them: CLI over ``--config`` YAML."""
    argv = list(vllm_argv)
    config = {}
    config_path = _find_option(argv, "config")
    if config_path is not None:
        config = _load_serve_config(config_path)

    model = argv[0] if argv and not argv[0].startswith("-") else None
    model = model or _find_option(argv, "model") or (str(config["model"]) if config.get("model") else None)

    spec_cfg: dict[str, Any] | None = None
    if config.get("speculative-config") is not None:
        spec_cfg = _as_spec_dict(config["speculative-config"], f"speculative-config in {config_path}")
    cli_spec = _find_option(argv, "speculative-config", "-sc")
    if cli_spec in ("", "None"):
        spec_cfg = None  # vLLM reads these as "no speculative decoding" (arg_utils.optional_type)
    elif cli_spec is not None:
        spec_cfg = _as_spec_dict(cli_spec, "--speculative-config")
    dotted = _dotted_options(argv, "speculative-config")
    if dotted:
        # vLLM 0.32's FlexibleArgumentParser turns the dotted options into one --speculative-config of their own,
        # which REPLACES the JSON / --config one ("Found duplicate keys --speculative-config"), not merges into it.
        spec_cfg = dotted
    for flag, key in (("spec-method", "method"), ("spec-model", "model"), ("spec-tokens", "num_speculative_tokens")):
        value = _find_option(argv, flag) or config.get(flag)
        if value is None:
            continue
        if spec_cfg is not None and key in spec_cfg:
            # vLLM raises the same at engine creation (arg_utils.create_speculative_config), after start-up began
            raise ServeInputError(f"--{flag} and --speculative-config['{key}'] are mutually exclusive; give one")
        spec_cfg = {**(spec_cfg or {}), key: value}
    return model, spec_cfg


def additional_config(vllm_argv: Sequence[str]) -> dict[str, Any]:
    """vLLM's ``--additional-config`` as vLLM will see it: the CLI JSON REPLACES the ``--config`` YAML's mapping (the
    YAML's comes first in vLLM's argv, argparse keeps the last); empty when neither sets it."""
    if _dotted_options(vllm_argv, "additional-config"):
        raise ServeInputError(
            "pass --additional-config as one JSON object, not dotted --additional-config.KEY "
            "options: vllm-eagle3 serve reads it to validate the capture spec before vLLM starts"
        )
    value = _find_option(vllm_argv, "additional-config")
    where = "--additional-config"
    if value is None:
        config_path = _find_option(vllm_argv, "config")
        value = _load_serve_config(config_path).get("additional-config") if config_path is not None else None
        where = f"additional-config in {config_path}"
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ServeInputError(
            f"{where} is not valid JSON ({exc}); write it like "
            '\'{"vllm_eagle3": {"capture_spec": {"taps": ["embed", 3, 31]}}}\''
        ) from None
    if not isinstance(data, dict):
        raise ServeInputError(f"{where} must be a JSON object, got {data!r}")
    return data


def without_option(argv: Sequence[str], name: str) -> list[str]:
    """argv without vLLM option ``--name VALUE`` / ``--name=VALUE`` (dashes/underscores alike), every occurrence."""
    out, i, argv = [], 0, list(argv)
    while i < len(argv):
        key, eq, _ = argv[i].partition("=")
        if key.startswith("--") and _norm(key) == name:
            i += 1 if eq else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def option(vllm_argv: Sequence[str], name: str, short: str | None = None) -> Any:
    """The value vLLM will use for option ``name`` (dashed, e.g. ``"pipeline-parallel-size"``): CLI over the
    ``--config`` YAML; None when neither sets it."""
    value = _find_option(vllm_argv, name, short)
    if value is not None:
        return value
    config_path = _find_option(vllm_argv, "config")
    return _load_serve_config(config_path).get(name) if config_path is not None else None


def int_option(vllm_argv: Sequence[str], name: str, short: str | None = None, default: int = 1) -> int:
    value = option(vllm_argv, name, short)
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ServeInputError(f"--{name} must be an integer, got {value!r}") from None
