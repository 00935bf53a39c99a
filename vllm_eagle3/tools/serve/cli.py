"""``vllm-eagle3 serve``: validate the capture spec statically, then run vLLM's own ``vllm serve``, supervised.

Data flow position: before anything runs, ``target config + draft config + draft fc header + spec`` are resolved
by :func:`vllm_eagle3.resolve.resolve_capture` (which taps feed the draft's ``fc``, in which order). Bad input
stops here with ONE line, ``vllm-eagle3: error: <what is wrong and how to fix it>``, exit code 2, and no vLLM
start-up. Good input is exported as ``EAGLE3_SPEC`` / ``EAGLE3_CONVENTION`` for the plugin, which reads
them in every vLLM process (API server, engine core, workers), and vLLM's CLI
(``vllm.entrypoints.cli.main.main``) runs with ``sys.argv = ["vllm", "serve", ...]`` in a child process that
``supervisor.py`` stops within 30 s on SIGTERM/SIGINT at any phase. On vLLM-CPU, ``vllm_cpu.py`` picks a KV cache
size when the user gave no memory setting, and fixed glibc malloc thresholds when vLLM would run on glibc malloc
(both logged, with how to override).

Everything but ``--capture-spec`` / ``--convention`` is vLLM's: the model (positional or ``--model``),
``--speculative-config JSON`` (or ``--spec-method/--spec-model/--spec-tokens``) and vLLM's ``--config serve.yaml``
(CLI values win over the file, as in vLLM). On a GPU install of vLLM the equivalent is plain
``EAGLE3_SPEC=configs/kimi_k25_eagle3.yaml vllm serve ...`` (the plugin is loaded through its entry point).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from vllm_eagle3 import envs
from vllm_eagle3.conventions import CONVENTIONS
from vllm_eagle3.resolve import ENV_CONVENTION, ENV_SPEC, check_pipeline_parallel, resolve_capture
from vllm_eagle3.spec import CaptureSpecError
from vllm_eagle3.tools.serve import cpu_attention
from vllm_eagle3.tools.serve.process import intel_openmp_library, with_intel_openmp
from vllm_eagle3.tools.serve.args import ServeInputError, int_option, option, serve_target_and_draft, take_option
from vllm_eagle3.tools.serve.supervisor import exit_on_stop_signals, supervise
from vllm_eagle3.watch import plugins_allowlist_with_endpoint
from vllm_eagle3.tools.serve.vllm_cpu import allocator_setting, install_vllm_cpu_version_shim, is_vllm_cpu, memory_setting

PROG = "vllm-eagle3 serve"
EXIT_BAD_INPUT = 2
CHILD_ENV = "_EAGLE3_SERVE_CHILD"

USAGE = f"""usage: {PROG} MODEL --speculative-config JSON [--capture-spec YAML | --convention NAME] [vllm serve options]
       {PROG} --config serve.yaml [--capture-spec YAML | --convention NAME] [vllm serve options]

Validate an EAGLE-3 capture spec against the target and draft (static, no engine), then run vLLM's own
`vllm serve` with the vllm-eagle3 plugin.

options of this wrapper (all other options are vLLM's; `{PROG} --vllm-help` lists them):
  --capture-spec YAML   capture-spec file, e.g. configs/kimi_k25_eagle3.yaml (taps: [embed, 3, 31]);
                        default: ${ENV_SPEC}
  --convention NAME     read the draft config's ids in this engine convention instead of a spec file
                        ({", ".join(CONVENTIONS)}); default: ${ENV_CONVENTION}
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

            return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"] if what == "draft"
                                          else ["*.json"]))
        except Exception as exc:  # noqa: BLE001 - any hub failure means "not found"; said in one line below
            reason = type(exc).__name__
            raise ServeInputError(f"{what} {name} does not exist as a folder and could not be fetched as a Hugging "
                                  f"Face repo ({reason}); check the path") from None
    raise ServeInputError(f"{what} {name} does not exist; check the path (relative paths are relative to "
                          f"{os.getcwd()})")


def speculative_method(spec_cfg: dict[str, Any]) -> str:
    """The method vLLM 0.32 will run (``config/speculative.py`` ~1326): the ``method`` given, else guessed from the
    draft's path (``"eagle-"`` -> eagle, ``"eagle3"`` -> eagle3), else another method (``"draft_model"``...)."""
    method = str(spec_cfg.get("method") or "").lower()
    if method:
        return method
    name = str(spec_cfg.get("model") or "").lower()
    return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "draft_model"


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
    spec_path = env.get(ENV_SPEC) or os.environ.get(ENV_SPEC) or None
    conv = env.get(ENV_CONVENTION) or os.environ.get(ENV_CONVENTION) or None
    if spec_cfg is None:
        if env:
            raise ServeInputError("--capture-spec/--convention given but no --speculative-config; add "
                                  "'{\"method\": \"eagle3\", \"model\": DRAFT, \"num_speculative_tokens\": 3}'")
        return env
    method = speculative_method(spec_cfg)
    if method != "eagle3":
        if spec_path or conv:
            given = "--capture-spec/--convention" if env else f"{ENV_SPEC}/{ENV_CONVENTION} (environment)"
            raise ServeInputError(
                f"{given} applies to EAGLE-3 drafts only, but vLLM will run speculative method {method!r} (from "
                f"{'the speculative config' if spec_cfg.get('method') else 'the draft path'}), which ignores it; "
                "set \"method\": \"eagle3\" in --speculative-config, or drop the capture spec"
            )
        return env  # another speculative method: nothing of ours to check
    draft_name = spec_cfg.get("model")
    if not draft_name:
        raise ServeInputError("--speculative-config has no \"model\"; name the EAGLE-3 draft folder")
    target = _local_folder(model, "target")
    draft = _local_folder(str(draft_name), "draft")
    resolution = resolve_capture(target, draft, spec_path=spec_path, convention=conv)
    check_pipeline_parallel(resolution.spec, resolution.target.num_layers,
                            int_option(vllm_argv, "pipeline-parallel-size", "-pp"),
                            os.environ.get("VLLM_PP_LAYER_PARTITION"))
    print(resolution.log_line(), file=sys.stderr, flush=True)
    return env


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
    current = os.environ.get("LD_PRELOAD", "")
    preload = with_intel_openmp(current, intel_openmp_library())
    return {"LD_PRELOAD": preload} if preload != current else {}


def memory_env(vllm_argv: Sequence[str]) -> dict[str, str]:
    """On vLLM-CPU, a KV cache size when the user chose no memory setting (see ``vllm_cpu.memory_setting``)."""
    if not is_vllm_cpu():
        return {}
    user_chose = any(option(vllm_argv, name) is not None for name in ("gpu-memory-utilization",
                                                                        "kv-cache-memory-bytes"))
    model, spec_cfg = serve_target_and_draft(vllm_argv)
    names = [model, (spec_cfg or {}).get("model")]
    folders = [Path(str(n)).expanduser() for n in names if n and Path(str(n)).expanduser().is_dir()]
    try:
        env, line = memory_setting(user_chose, os.environ, folders,
                                   tp=int_option(vllm_argv, "tensor-parallel-size", "-tp"))
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
        if key.startswith("-") and (key == "-sc" or name.split(".", 1)[0] == "speculative-config"
                                    or name in ("spec-method", "spec-model", "spec-tokens")):
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
            amx=cpu_attention.host_has_amx() if amx is None else amx, dtype=option(vllm_argv, "dtype"),
            target_is_mla=cpu_attention.folder_is_mla(model),
            draft_is_mla=cpu_attention.folder_is_mla((spec_cfg or {}).get("model")),
            target_backend=option(vllm_argv, "attention-backend"),
            draft_backend=(spec_cfg or {}).get("attention_backend"))
    except cpu_attention.BackendChoiceError as exc:
        raise ServeInputError(str(exc)) from None
    if choice.line:
        print(choice.line, file=sys.stderr, flush=True)
    argv = list(vllm_argv)
    if choice.draft:
        if option(vllm_argv, "spec-method") or option(vllm_argv, "spec-model") or option(vllm_argv, "spec-tokens"):
            raise ServeInputError("the MLA draft needs \"attention_backend\": \"CPU_MLA\" on this AMX host in float32, "
                                  "which cannot be added to --spec-* shorthands; pass --speculative-config JSON with it, "
                                  "or serve bfloat16")
        argv = [*_strip_speculative_options(argv), "--speculative-config",
                json.dumps({**(spec_cfg or {}), "attention_backend": choice.draft})]
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.pop(CHILD_ENV, None) == "1":
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
        env = validate(argv, capture_spec, convention)
        argv = attention_argv(argv)
        env.update(memory_env(argv))
        env.update(openmp_env())
        env.update(allocator_env({**os.environ, **env}))
        plugins = plugins_allowlist_with_endpoint({**os.environ, **env})
        if plugins is not None:  # vLLM loads endpoint plugins only when named: add the wiring watch's route
            env["VLLM_PLUGINS"] = plugins
    except CaptureSpecError as exc:
        print(f"vllm-eagle3: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # vLLM runs in a supervised child so that a stop signal ends it at any phase (supervisor.py); the env reaches
    # vLLM's engine core and workers, where the plugin reads it.
    child_env = {**os.environ, **env, CHILD_ENV: "1"}
    return supervise([sys.executable, "-m", "vllm_eagle3.tools.serve", *argv], child_env)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
