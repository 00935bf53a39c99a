"""``vllm-eagle3 serve`` reads the target, the speculative config and the pipeline size exactly as vLLM will.

The wrapper validates in ~0.1 s without importing vLLM (10-18 s), so it reads vLLM's options itself
(``tools/serve/args.py``). Guards drift from vLLM's own parser: here both read the same command lines and must
agree. Found this way (issue 11): a dotted ``--speculative-config.num_speculative_tokens 5`` REPLACES the serve
config's speculative config in vLLM 0.32 (the draft model is then gone) where the wrapper had merged the two and
validated a draft vLLM would not load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_eagle3.resolve import spec_source
from vllm_eagle3.tools.serve.args import ServeInputError, additional_config, int_option, serve_target_and_draft
from vllm_eagle3.tools.serve.cli import capture_spec_argv

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SERVE_YAML = str(REPO / "configs" / "serve_kimi_k25_mini.yaml")
JSON3 = json.dumps({"method": "eagle3", "model": "d", "num_speculative_tokens": 3})

CASES = [
    ["models/kimi-k25-mini", "--speculative-config", JSON3],
    ["--config", SERVE_YAML],
    ["--config", SERVE_YAML, "--speculative-config.num_speculative_tokens", "5"],
    ["--config", SERVE_YAML, "--speculative-config", json.dumps({"method": "eagle3", "model": "x"})],
    ["m", "--speculative-config", JSON3, "--speculative-config.num_speculative_tokens", "5"],
    ["m", "--speculative_config.model", "d", "--speculative-config.method=eagle3"],
    ["m", "-sc", json.dumps({"model": "d"})],
    ["m", "--speculative-config", "None"],
    ["--model", "m2", "-pp", "2", "-tp=2"],
    ["--config", SERVE_YAML, "--model", "m3", "--pipeline_parallel_size", "3"],
    ["m", "--speculative-config=" + JSON3, "--pipeline-parallel-size=2"],
    ["--config", SERVE_YAML, "--additional-config", json.dumps({"other": 1})],
    ["m", "--additional_config=" + json.dumps({"vllm_eagle3": {"convention": "vllm"}})],
]

VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
out = []
for argv in json.loads(sys.argv[1]):
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    a = parser.parse_args(["serve", *argv])
    out.append([a.model_tag or a.model, a.speculative_config, a.pipeline_parallel_size, a.tensor_parallel_size,
                a.additional_config])
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_reads():
    proc = subprocess.run(
        [sys.executable, "-c", VLLM_PARSE, json.dumps(CASES)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT") :])


@pytest.mark.parametrize("i", range(len(CASES)))
def test_wrapper_reads_what_vllm_reads(vllm_reads, i):
    argv = CASES[i]
    model, spec, pp, tp, extra = vllm_reads[i]
    assert serve_target_and_draft(argv) == (model, spec), argv
    assert additional_config(argv) == extra, argv
    assert int_option(argv, "pipeline-parallel-size", "-pp") == pp
    assert int_option(argv, "tensor-parallel-size", "-tp") == tp


def test_shorthand_conflicting_with_the_speculative_config_is_refused_before_start_up():
    """vLLM raises this only when it creates the engine config, seconds into start-up."""
    with pytest.raises(
        ServeInputError,
        match=r"--spec-model and --speculative-config\['model'\] are mutually "
        r"exclusive",
    ):
        serve_target_and_draft(["m", "--speculative-config", JSON3, "--spec-model", "other"])


def test_vllm_reads_the_shipped_serve_yaml_spec(vllm_reads):
    """Plain ``vllm serve --config configs/serve_kimi_k25_mini.yaml`` must serve [embed, 3, 31] with no env var:
    vLLM's parser turns the YAML's ``additional-config:`` mapping into the ``--additional-config`` JSON (a mapping
    written as a YAML string, or a key vLLM renames, would leave the workers without a spec)."""
    extra = vllm_reads[CASES.index(["--config", SERVE_YAML])][4]
    src = spec_source(extra, {})
    assert src.origin == "--additional-config" and src.spec_file.spec.label() == "[embed, 3, 31]"


def test_capture_spec_goes_into_the_additional_config():
    """``--capture-spec FILE`` reaches every vLLM process inside vLLM's config, merged with what the user passed; a
    spec the config already carries is left alone, a different one is refused naming both (serving either silently
    would capture taps the user did not ask for)."""
    spec = str(REPO / "configs" / "kimi_k25_eagle3.yaml")
    four = str(REPO / "configs" / "kimi_k25_eagle3_4tap.yaml")
    assert capture_spec_argv(["--config", SERVE_YAML], spec, None) == ["--config", SERVE_YAML]
    with pytest.raises(
        ServeInputError,
        match=r"--capture-spec .*4tap.yaml \(taps \[embed, 3, 31, 59\]\) and the "
        r"additional-config of .*serve_kimi_k25_mini.yaml .*taps \[embed, 3, 31\]"
        r"\) name different capture specs",
    ):
        capture_spec_argv(["--config", SERVE_YAML], four, None)
    argv = capture_spec_argv(["m", "--additional-config", json.dumps({"other": {"x": 1}})], four, "vllm")
    assert argv[:2] == ["m", "--additional-config"] and len(argv) == 3
    merged = json.loads(argv[2])
    assert merged["other"] == {"x": 1} and merged["vllm_eagle3"]["convention"] == "vllm"
    assert spec_source(merged, {}).spec_file.spec.label() == "[embed, 3, 31, 59]"
    replaced = capture_spec_argv(["--config", SERVE_YAML, "--additional-config", "{}"], four, None)
    assert spec_source(additional_config(replaced), {}).spec_file.spec.label() == "[embed, 3, 31, 59]"
    with pytest.raises(ServeInputError, match="--convention vllm and --additional-config .* disagree"):
        capture_spec_argv(
            ["m", "--additional-config", json.dumps({"vllm_eagle3": {"convention": "sglang"}})], None, "vllm"
        )


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_stop_grace_must_be_positive_seconds(value):
    from vllm_eagle3.tools.serve.cli import stop_grace

    with pytest.raises(ServeInputError, match=rf"--stop-grace {value}: give the seconds vLLM may take to stop"):
        stop_grace(value)


def test_stop_grace_default_and_value():
    from vllm_eagle3.tools.serve.cli import STOP_GRACE_S, stop_grace

    assert stop_grace(None) == STOP_GRACE_S == 20 and stop_grace("5") == 5.0 and stop_grace("2.5") == 2.5
