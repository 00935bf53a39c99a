"""``vllm-eagle3 serve``: validate the capture spec statically, then run vLLM's own ``vllm serve``, supervised.

Data flow position: before anything runs, ``target config + draft config + draft fc header + spec`` are resolved
by :func:`vllm_eagle3.resolve.resolve_capture` (which taps feed the draft's ``fc``, in which order). Bad input
stops here with ONE line, ``vllm-eagle3: error: <what is wrong and how to fix it>``, exit code 2, and no vLLM
start-up. ``--capture-spec FILE`` / ``--convention`` go into vLLM's ``--additional-config`` (merged with the one the
user passed or the ``--config`` YAML carries): part of vLLM's config, it reaches every vLLM process (API server,
engine core, workers, other nodes), where the plugin reads it (:func:`vllm_eagle3.resolve.spec_source`). vLLM's CLI
(``vllm.entrypoints.cli.main.main``) runs with ``sys.argv = ["vllm", "serve", ...]`` in a child process that
``supervisor.py`` stops within 30 s on SIGTERM/SIGINT at any phase. On vLLM-CPU, ``vllm_cpu.py`` picks a KV cache
size when the user gave no memory setting, and fixed glibc malloc thresholds when vLLM would run on glibc malloc
(both logged, with how to override).

Everything but ``--capture-spec`` / ``--convention`` / ``--stop-grace`` is vLLM's: the model (positional or
``--model``), ``--speculative-config JSON`` (or ``--spec-method/--spec-model/--spec-tokens``) and vLLM's
``--config serve.yaml`` (CLI values win over the file, as in vLLM). On a GPU install of vLLM the equivalent is plain
``vllm serve`` with the spec in ``--additional-config`` (the plugin is loaded through its entry point).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3 import cpu_attention, envs
from vllm_eagle3.conventions import CONVENTIONS
from vllm_eagle3.pipeline import check_pipeline_parallel
from vllm_eagle3.resolve import (
    CONFIG_KEY,
    ENV_CONVENTION,
    ENV_SPEC,
    plugin_config,
    read_spec_mapping,
    resolve_capture,
    spec_file_from_mapping,
    spec_source,
)
from vllm_eagle3.spec import CaptureSpecError
from vllm_eagle3.tools.serve.process import intel_openmp_library, with_intel_openmp
from vllm_eagle3.tools.serve.args import (
    ServeInputError,
    additional_config,
    int_option,
    option,
    serve_target_and_draft,
    take_option,
    without_option,
)
from vllm_eagle3.tools.serve.supervisor import STOP_GRACE_S, exit_on_stop_signals, supervise
from vllm_eagle3.tools.serve.vllm_cpu import (
    allocator_setting,
    install_vllm_cpu_version_shim,
    is_vllm_cpu,
    memory_setting,
)

PROG = "vllm-eagle3 serve"
EXIT_BAD_INPUT = 2
CHILD_ENV = "_EAGLE3_SERVE_CHILD"

USAGE = f"""usage: {PROG} MODEL --speculative-config JSON [--capture-spec YAML | --convention NAME] [vllm serve options]
       {PROG} --config serve.yaml [--capture-spec YAML | --convention NAME] [vllm serve options]

Validate an EAGLE-3 capture spec against the target and draft (static, no engine), then run vLLM's own
`vllm serve` with the vllm-eagle3 plugin.

options of this wrapper (all other options are vLLM's; `{PROG} --vllm-help` lists them):
  --capture-spec YAML   capture-spec file, e.g. configs/kimi_k25_eagle3.yaml (taps: [embed, 3, 31]); its content
                        goes into --additional-config '{{"{CONFIG_KEY}": {{"capture_spec": ...}}}}'; default: the
                        spec that --additional-config (or the --config YAML) carries, else ${ENV_SPEC}
  --convention NAME     read the draft config's ids in this engine convention instead of a spec file
                        ({", ".join(CONVENTIONS)}); default: ${ENV_CONVENTION}
  --stop-grace SECONDS  after SIGTERM / SIGINT / SIGHUP, how long vLLM may take to stop before everything it
                        started is killed (default {STOP_GRACE_S:.0f}; keep it below your orchestrator's kill timeout)
  --vllm-help[=GROUP]   show vLLM's `vllm serve --help` (GROUP: all, ModelConfig, Frontend, ...)
  -h, --help            show this message

Bad input (unknown convention, taps out of range or duplicated, fan-in mismatch with the draft's fc, missing d2t,
spec vs draft conflict, missing draft) exits with code {EXIT_BAD_INPUT} and one line `vllm-eagle3: error: ...`.
On vllm-cpu, whose `vllm serve` cannot read its own version, this wrapper is the working `vllm serve`."""


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

            return Path(
                snapshot_download(name, allow_patterns=["*.json", "*.safetensors"] if what == "draft" else ["*.json"])
            )
        except Exception as exc:  # noqa: BLE001 - any hub failure means "not found"; said in one line below
            reason = type(exc).__name__
            raise ServeInputError(
                f"{what} {name} does not exist as a folder and could not be fetched as a Hugging "
                f"Face repo ({reason}); check the path"
            ) from None
    raise ServeInputError(
        f"{what} {name} does not exist; check the path (relative paths are relative to {os.getcwd()})"
    )


def speculative_method(spec_cfg: dict[str, Any]) -> str:
    """The method vLLM 0.32 will run, guessed as ``SpeculativeConfig.__post_init__`` (``config/speculative.py``)
    guesses it, so that serve checks the capture spec exactly where vLLM will run EAGLE-3: the ``method`` given,
    else from the draft's path (``"eagle-"`` -> eagle, ``"eagle3"`` -> eagle3), else another method
    (``"draft_model"``...)."""
    method = str(spec_cfg.get("method") or "").lower()
    if method:
        return method
    name = str(spec_cfg.get("model") or "").lower()
    return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "draft_model"


# ------------------------------------------------------------------------------------------- validation


def _same_spec(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two capture-spec mappings capture the same way (their description aside)."""
    fa, fb = spec_file_from_mapping(a, "a"), spec_file_from_mapping(b, "b")
    return (fa.spec.taps, fa.num_layers, fa.draft_ids_convention, fa.watch, fa.check) == (
        fb.spec.taps,
        fb.num_layers,
        fb.draft_ids_convention,
        fb.watch,
        fb.check,
    )


def capture_spec_argv(vllm_argv: Sequence[str], capture_spec: str | None, convention: str | None) -> list[str]:
    """vLLM's argv with ``--capture-spec`` / ``--convention`` inside its ``--additional-config`` (merged with the one
    vLLM would read: the CLI's, else the ``--config`` YAML's). Unchanged when that already says the same; a
    different spec or convention there is an error naming both."""
    if capture_spec is None and convention is None:
        return list(vllm_argv)
    extra = additional_config(vllm_argv)
    mine = plugin_config(extra)
    on_cli = any(a.split("=", 1)[0].replace("_", "-") == "--additional-config" for a in vllm_argv)
    where = "--additional-config" if on_cli else f"the additional-config of {option(vllm_argv, 'config')}"
    wanted = dict(mine)
    if capture_spec is not None:
        content = read_spec_mapping(Path(capture_spec).expanduser())
        spec_file_from_mapping(content, str(capture_spec))  # its own errors first, naming the file
        given = mine.get("capture_spec")
        if given is not None and not _same_spec(given, content):
            raise ServeInputError(
                f"--capture-spec {capture_spec} (taps {spec_file_from_mapping(content, capture_spec).spec.label()}) "
                f"and {where} ({CONFIG_KEY}.capture_spec, taps "
                f"{spec_file_from_mapping(given, where).spec.label()}) name different capture specs; give one: drop "
                "--capture-spec, or pass --additional-config '{}' to replace the config's"
            )
        wanted["capture_spec"] = given if given is not None else content
    if convention is not None:
        if mine.get("convention") not in (None, convention):
            raise ServeInputError(
                f"--convention {convention} and {where} ({CONFIG_KEY}.convention: "
                f"{mine['convention']}) disagree; give one"
            )
        wanted["convention"] = convention
    if wanted == mine:
        return list(vllm_argv)
    return [
        *without_option(vllm_argv, "additional-config"),
        "--additional-config",
        json.dumps({**extra, CONFIG_KEY: wanted}),
    ]


def validate(vllm_argv: Sequence[str], given: bool) -> None:
    """Resolve target + draft + spec statically, the spec found as every vLLM process will find it
    (:func:`vllm_eagle3.resolve.spec_source`); ``given``: --capture-spec/--convention was passed. Raises
    CaptureSpecError."""
    model, spec_cfg = serve_target_and_draft(vllm_argv)
    if model is None:
        raise ServeInputError(
            "no model given; pass it first (`vllm-eagle3 serve MODEL ...`) or as `model:` in the --config YAML"
        )
    if spec_cfg is None:
        if given:
            raise ServeInputError(
                "--capture-spec/--convention given but no --speculative-config; add "
                '\'{"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3}\''
            )
        return
    method = speculative_method(spec_cfg)
    src = spec_source(additional_config(vllm_argv))
    if method != "eagle3":
        if src.spec_file is not None or src.convention:
            origin = "--capture-spec/--convention" if given else src.origin
            raise ServeInputError(
                f"{origin} applies to EAGLE-3 drafts only, but vLLM will run speculative method {method!r} (from "
                f"{'the speculative config' if spec_cfg.get('method') else 'the draft path'}), which ignores it; "
                'set "method": "eagle3" in --speculative-config, or drop the capture spec'
            )
        return  # another speculative method: nothing of ours to check
    draft_name = spec_cfg.get("model")
    if not draft_name:
        raise ServeInputError('--speculative-config has no "model"; name the EAGLE-3 draft folder')
    target = _local_folder(model, "target")
    draft = _local_folder(str(draft_name), "draft")
    resolution = resolve_capture(
        target, draft, spec_path=src.spec_file, convention=src.convention, spec_from=src.label()
    )
    assumed = check_pipeline_parallel(
        resolution.spec,
        resolution.target.num_layers,
        int_option(vllm_argv, "pipeline-parallel-size", "-pp"),
        envs.get("VLLM_PP_LAYER_PARTITION"),
    )
    if assumed:  # which runner the pre-start check assumed (each stage checks vLLM's actual choice again)
        print(f"vllm-eagle3: {assumed}", file=sys.stderr, flush=True)
    print(resolution.log_line(), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- running vLLM


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


def openmp_env() -> dict[str, str]:
    """On vLLM-CPU, Intel OpenMP preloaded for vLLM's processes (vLLM warns that speculative decoding is slow
    without it; measured ~15% faster at batch 1), unless an OpenMP runtime is preloaded already."""
    if not is_vllm_cpu():
        return {}
    current = envs.get("LD_PRELOAD")
    preload = with_intel_openmp(current, intel_openmp_library())
    return {"LD_PRELOAD": preload} if preload != current else {}


def memory_env(vllm_argv: Sequence[str]) -> dict[str, str]:
    """On vLLM-CPU, a KV cache size when the user chose no memory setting (see ``vllm_cpu.memory_setting``)."""
    if not is_vllm_cpu():
        return {}
    user_chose = any(
        option(vllm_argv, name) is not None for name in ("gpu-memory-utilization", "kv-cache-memory-bytes")
    )
    model, spec_cfg = serve_target_and_draft(vllm_argv)
    names = [model, (spec_cfg or {}).get("model")]
    folders = [Path(str(n)).expanduser() for n in names if n and Path(str(n)).expanduser().is_dir()]
    try:
        env, line = memory_setting(
            user_chose, os.environ, folders, tp=int_option(vllm_argv, "tensor-parallel-size", "-tp")
        )
    except ValueError as exc:
        raise ServeInputError(str(exc)) from None
    if line:
        print(line, file=sys.stderr, flush=True)
    return env


def _strip_speculative_options(argv: Sequence[str]) -> list[str]:
    """argv without its ``--speculative-config`` (JSON, ``-sc``, dotted) and ``--spec-*`` options, so that ONE full
    ``--speculative-config`` appended after it is what vLLM reads."""
    out, i, argv = [], 0, list(argv)
    while i < len(argv):
        key, eq, _ = argv[i].partition("=")
        name = key.lstrip("-").replace("_", "-")
        if key.startswith("-") and (
            key == "-sc"
            or name.split(".", 1)[0] == "speculative-config"
            or name in ("spec-method", "spec-model", "spec-tokens")
        ):
            i += 1 if eq else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def attention_argv(vllm_argv: Sequence[str], amx: bool | None = None) -> list[str]:
    """On vLLM-CPU, the MLA attention backends this host can load (see ``cpu_attention.choose``): CPU_MLA for a
    float32 target (and MLA draft) on an AMX host unless the user chose; logged. Returns the argv vLLM gets."""
    if not is_vllm_cpu():
        return list(vllm_argv)
    model, spec_cfg = serve_target_and_draft(vllm_argv)
    try:
        choice = cpu_attention.choose(
            amx=cpu_attention.host_has_amx() if amx is None else amx,
            dtype=option(vllm_argv, "dtype"),
            target_is_mla=cpu_attention.folder_is_mla(model),
            draft_is_mla=cpu_attention.folder_is_mla((spec_cfg or {}).get("model")),
            target_backend=option(vllm_argv, "attention-backend"),
            draft_backend=(spec_cfg or {}).get("attention_backend"),
        )
    except cpu_attention.BackendChoiceError as exc:
        raise ServeInputError(str(exc)) from None
    if choice.line:
        print(choice.line, file=sys.stderr, flush=True)
    argv = list(vllm_argv)
    if choice.draft:
        if option(vllm_argv, "spec-method") or option(vllm_argv, "spec-model") or option(vllm_argv, "spec-tokens"):
            raise ServeInputError(
                'the MLA draft needs "attention_backend": "CPU_MLA" on this AMX host in float32, '
                "which cannot be added to --spec-* shorthands; "
                "pass --speculative-config JSON with it, or serve bfloat16"
            )
        argv = [
            *_strip_speculative_options(argv),
            "--speculative-config",
            json.dumps({**(spec_cfg or {}), "attention_backend": choice.draft}),
        ]
    if choice.target:
        argv += ["--attention-backend", choice.target]
    return argv


def allocator_env(environ: dict[str, str]) -> dict[str, str]:
    """On vLLM-CPU without tcmalloc, fixed glibc malloc thresholds (see ``vllm_cpu.allocator_setting``), logged.
    ``environ``: the environment vLLM will get (LD_PRELOAD as chosen by :func:`openmp_env`)."""
    if not is_vllm_cpu():
        return {}
    env, line = allocator_setting(environ)
    if line:
        print(line, file=sys.stderr, flush=True)
    return env


def stop_grace(value: str | None) -> float:
    """``--stop-grace``'s seconds (default :data:`STOP_GRACE_S`); a value that is not a positive number is refused."""
    if value is None:
        return STOP_GRACE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ServeInputError(f"--stop-grace {value}: give the seconds vLLM may take to stop, e.g. --stop-grace 10")
    return seconds


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if envs.get(CHILD_ENV):
        os.environ.pop(CHILD_ENV, None)
        return run_vllm_serve(argv)  # the supervised child: validated already
    if not argv or argv[0] in ("-h", "--help") or argv == ["help"]:
        print(USAGE)
        return 0
    exit_on_stop_signals()  # until the supervisor takes over: a stop signal during validation ends us, stated
    for arg in argv:
        if arg == "--vllm-help" or arg.startswith("--vllm-help="):
            group = arg.partition("=")[2]
            return run_vllm_serve([f"--help={group}" if group else "--help"])
    try:
        capture_spec, argv = take_option(argv, ["--capture-spec", "--capture_spec"])
        convention, argv = take_option(argv, ["--convention"])
        grace, argv = take_option(argv, ["--stop-grace"])
        grace_s = stop_grace(grace)
        argv = capture_spec_argv(argv, capture_spec, convention)
        validate(argv, given=capture_spec is not None or convention is not None)
        env: dict[str, str] = {}
        argv = attention_argv(argv)
        env.update(memory_env(argv))
        env.update(openmp_env())
        env.update(allocator_env({**os.environ, **env}))
    except CaptureSpecError as exc:
        print(f"vllm-eagle3: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # vLLM runs in a supervised child so that a stop signal ends it at any phase (supervisor.py); the env reaches
    # vLLM's engine core and workers, where the plugin reads it.
    child_env = {**os.environ, **env, CHILD_ENV: "1"}
    return supervise([sys.executable, "-m", "vllm_eagle3.tools.serve", *argv], child_env, grace_s)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
