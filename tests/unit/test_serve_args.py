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

from vllm_eagle3.tools.serve.args import ServeInputError, int_option, serve_target_and_draft

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
    out.append([a.model_tag or a.model, a.speculative_config, a.pipeline_parallel_size, a.tensor_parallel_size])
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_reads():
    proc = subprocess.run([sys.executable, "-c", VLLM_PARSE, json.dumps(CASES)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("i", range(len(CASES)))
def test_wrapper_reads_what_vllm_reads(vllm_reads, i):
    argv = CASES[i]
    model, spec, pp, tp = vllm_reads[i]
    assert serve_target_and_draft(argv) == (model, spec), argv
    assert int_option(argv, "pipeline-parallel-size", "-pp") == pp
    assert int_option(argv, "tensor-parallel-size", "-tp") == tp


def test_shorthand_conflicting_with_the_speculative_config_is_refused_before_start_up():
    """vLLM raises this only when it creates the engine config, seconds into start-up."""
    with pytest.raises(ServeInputError, match=r"--spec-model and --speculative-config\['model'\] are mutually "
                                              r"exclusive"):
        serve_target_and_draft(["m", "--speculative-config", JSON3, "--spec-model", "other"])
