"""The examples are scripts a user can copy: each answers ``--help`` and imports nothing from this project.

Guards issue 40: ``examples/client.py`` imported ``vllm_eagle3.tools.demo`` and ``examples/image_client.py``
``vllm_eagle3.tools.images``, so neither ran outside a checkout with the package installed. Also that the client's
own ``/metrics`` reading gives the acceptance the project's parser gives (a copied client must not report another
number than ``vllm-eagle3 demo``). Issue 48: the clients take vLLM's usual base URL (``http://localhost:8000/v1``,
with or without ``/v1``) and the OpenAI client's environment variables. Runs the scripts as subprocesses and local
HTTP servers standing in for vLLM; no engine.
"""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
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

    bodies = [
        METRICS % dict(drafts=10.0, tokens=30.0, accepted=12.0, p0=7.0, p1=4.0, p2=1.0),
        METRICS % dict(drafts=50.0, tokens=150.0, accepted=71.0, p0=33.0, p1=25.0, p2=13.0),
    ]
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


class FakeVllm(http.server.BaseHTTPRequestHandler):
    """Answers the OpenAI routes the examples call and /metrics as vLLM does, noting each path and Authorization."""

    seen: list[tuple[str, str]] = []
    MODEL = {"id": "m", "object": "model", "created": 0, "owned_by": "vllm"}
    USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    ANSWERS = {
        "/v1/models": {"object": "list", "data": [MODEL]},
        "/v1/completions": {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "usage": USAGE,
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length", "logprobs": None}],
        },
        "/v1/chat/completions": {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "usage": USAGE,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        },
    }

    def answer(self):
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path == "/metrics":
            body, kind = b"# no speculative counters\n", "text/plain"
        elif self.path in self.ANSWERS:
            body, kind = json.dumps(self.ANSWERS[self.path]).encode(), "application/json"
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer  # noqa: N815 - http.server's names

    def log_message(self, *args):
        pass


@pytest.fixture()
def fake_vllm():
    FakeVllm.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "", "/"])
def test_clients_take_the_base_url_with_or_without_v1(fake_vllm, suffix, monkeypatch, capsys):
    """Issue 48: ``--base-url`` appended /v1 itself, so vLLM's usual ``http://localhost:8000/v1`` asked for
    /v1/v1/models (404). Either form now reaches /v1/... for the API and the root for /metrics."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert load("client").main(["--base-url", fake_vllm + suffix, "--prompt", "x", "--no-chat"]) == 0
    assert load("image_client").main(["--base-url", fake_vllm + suffix]) == 0
    paths = [p for p, _ in FakeVllm.seen]
    assert paths == ["/v1/models", "/metrics", "/v1/completions", "/metrics", "/v1/models", "/v1/chat/completions"]
    assert "speculative decoding: off" in capsys.readouterr().out


def test_clients_read_the_openai_environment(fake_vllm, monkeypatch):
    """With no flags the examples use OPENAI_BASE_URL and OPENAI_API_KEY, as the OpenAI client itself does."""
    monkeypatch.setenv("OPENAI_BASE_URL", fake_vllm + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert load("client").main(["--prompt", "x", "--no-chat"]) == 0
    assert load("image_client").main([]) == 0
    api = [auth for path, auth in FakeVllm.seen if path.startswith("/v1/")]
    assert len(api) == 4 and set(api) == {"Bearer sk-test"}, FakeVllm.seen


def test_the_default_base_url_is_vllms():
    for name in ("client", "image_client"):
        module = load(name)
        assert module.DEFAULT_BASE_URL == "http://localhost:8000/v1"
        assert module.urls("http://h:1/v1/") == module.urls("http://h:1") == ("http://h:1/v1", "http://h:1")
