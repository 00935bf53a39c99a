"""The examples are scripts a user can copy: each answers ``--help`` and imports nothing from this project.

Guards issue 40: ``examples/client.py`` imported ``vllm_eagle3.tools.demo`` and ``examples/image_client.py``
``vllm_eagle3.tools.images``, so neither ran outside a checkout with the package installed. Also that the client's
own ``/metrics`` reading gives the acceptance the project's parser gives (a copied client must not report another
number than ``vllm-eagle3 demo``). Runs the scripts as subprocesses and one local HTTP server; no engine.
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
ALLOWED_THIRD_PARTY = {"openai"}


def test_there_are_examples():
    """The parametrised tests below would pass on an empty folder."""
    assert {p.name for p in SCRIPTS} >= {"client.py", "image_client.py", "serve_miniature.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_runs_from_anywhere(script, tmp_path):
    """Every example answers --help, run from an unrelated folder with the project's folders off sys.path."""
    cmd = [sys.executable, "-I", str(script), "--help"] if script.suffix == ".py" else ["bash", str(script), "--help"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--base-url" in r.stdout or "--port" in r.stdout, r.stdout


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.suffix == ".py"], ids=lambda p: p.name)
def test_imports_only_the_standard_library_and_openai(script):
    """A copied example must not need this project (or anything but the openai client) installed."""
    tree = ast.parse(script.read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    extra = mods - set(sys.stdlib_module_names) - {"__future__"} - ALLOWED_THIRD_PARTY
    assert not extra, f"{script.name} imports {sorted(extra)}: examples use only the standard library and openai"


METRICS = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(drafts)s
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(tokens)s
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(accepted)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} %(p0)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} %(p1)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} %(p2)s
"""


def test_client_acceptance_matches_the_project_parser():
    """The copied client's acceptance length and per-position rates equal SpecDecodeCounters' on the same /metrics."""
    from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

    bodies = [METRICS % dict(drafts=10.0, tokens=30.0, accepted=12.0, p0=7.0, p1=4.0, p2=1.0),
              METRICS % dict(drafts=50.0, tokens=150.0, accepted=71.0, p0=33.0, p1=25.0, p2=13.0)]
    served = list(bodies)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = served.pop(0).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = importlib.util.spec_from_file_location("example_client", EXAMPLES / "client.py")
        client = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(client)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        line = client.acceptance_line(client.spec_counters(url), client.spec_counters(url))
    finally:
        server.shutdown()
    ours = SpecDecodeCounters.from_metrics(bodies[1]) - SpecDecodeCounters.from_metrics(bodies[0])
    assert f"acceptance length {ours.acceptance_length:.2f}" in line, line
    assert "per position [" + ", ".join(f"{p:.2f}" for p in ours.per_position) + "]" in line, line
    assert "59 of 120 drafted tokens accepted" in line, line
