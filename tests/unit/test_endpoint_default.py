"""vllm_eagle3/model_patches/vllm_endpoint_default.py: GET /v1/eagle3/wiring without VLLM_PLUGINS, on vLLM's own loader.

Stock vLLM 0.32 attaches an endpoint plugin only when ``VLLM_PLUGINS`` names it, so plain ``vllm serve`` answered 404
on the wiring route and warned "Found endpoint plugin(s) ... but VLLM_PLUGINS is not set" at every start (issue 40
item 3). Here vLLM's real ``attach_endpoint_plugins`` builds the routes of a real FastAPI app, no engine. A second
endpoint plugin is a real distribution on ``sys.path`` (a ``.dist-info`` with an entry point), found by
``importlib.metadata`` as any installed package is.
"""

from __future__ import annotations

import logging
import textwrap

import pytest

pytestmark = pytest.mark.unit

ROUTE = "/v1/eagle3/wiring"
OTHER_ROUTE = "/v1/other-plugin"


@pytest.fixture()
def patched():
    """The patch applied as the plugin applies it (once per process)."""
    from vllm import __version__

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_endpoint_default

    record = model_patches.apply(vllm_endpoint_default.PATCH, str(__version__))
    assert "vllm_endpoint_default" in record and "skipped" not in record, record
    return vllm_endpoint_default


@pytest.fixture()
def other_plugin(tmp_path, monkeypatch):
    """A second installed endpoint plugin, ``other_endpoint`` (someone else's route, not read-only for all we know)."""
    (tmp_path / "other_endpoint_mod.py").write_text(
        textwrap.dedent(f'''
        class Other:
            name = "other_endpoint"
            required_tasks = None

            def attach_router(self, app):
                app.add_api_route("{OTHER_ROUTE}", lambda: {{"other": True}}, methods=["GET"])

            async def init_state(self, engine_client, state, args):
                return None
    ''')
    )
    info = tmp_path / "other_endpoint-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: other-endpoint\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vllm.endpoint_plugins]\nother_endpoint = other_endpoint_mod:Other\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "other_endpoint"


def _routes(monkeypatch, plugins: str | None) -> set[str]:
    """The paths of a FastAPI app after vLLM's ``attach_endpoint_plugins`` with ``VLLM_PLUGINS`` = ``plugins``."""
    from fastapi import FastAPI
    from vllm.plugins.endpoint_plugins.interface import attach_endpoint_plugins

    if plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", plugins)
    app = FastAPI()
    attach_endpoint_plugins(app, ("generate",))
    return {getattr(r, "path", None) for r in app.routes}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_wiring_route_without_vllm_plugins_and_vllms_rule_when_set(patched, monkeypatch):
    """Guards: plain `vllm serve` (VLLM_PLUGINS unset) answering 404 on GET /v1/eagle3/wiring, and the patch
    overriding an operator's allowlist (set without vllm_eagle3_wiring: no route; set with it: the route)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.plugins.endpoint_plugins.interface import attach_endpoint_plugins

    assert ROUTE in _routes(monkeypatch, None)
    assert ROUTE not in _routes(monkeypatch, "vllm_eagle3")
    assert ROUTE in _routes(monkeypatch, "vllm_eagle3,vllm_eagle3_wiring")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    app = FastAPI()
    attach_endpoint_plugins(app, ("generate",))
    answer = TestClient(app).get(ROUTE)
    assert answer.status_code == 200, answer.text
    assert answer.json()["verdict"] and "verdicts" in answer.json(), answer.json()
    assert patched.stock_load_endpoint_plugins()(("generate",)) == []  # what stock vLLM did: no route


def test_other_endpoint_plugins_keep_vllms_rule(patched, other_plugin, monkeypatch):
    """Guards: the patch loading EVERY endpoint plugin with VLLM_PLUGINS unset (another package's routes would
    appear unasked), and vLLM's warning either naming our route (which did load) or vanishing for the others."""
    import vllm.plugins

    lines = _Lines()
    vllm.plugins.logger.addHandler(lines)
    try:
        unset = _routes(monkeypatch, None)
    finally:
        vllm.plugins.logger.removeHandler(lines)
    assert ROUTE in unset and OTHER_ROUTE not in unset, unset
    found = [x for x in lines.lines if "Found endpoint plugin(s)" in x]
    assert len(found) == 1 and other_plugin in found[0] and "vllm_eagle3_wiring" not in found[0], lines.lines
    named = _routes(monkeypatch, other_plugin)
    assert OTHER_ROUTE in named and ROUTE not in named, named


def test_no_warning_for_ours_alone(patched, monkeypatch):
    """Guards: vLLM's "Found endpoint plugin(s) ... VLLM_PLUGINS is not set" warning at every plain `vllm serve`
    start although the only endpoint plugin installed (ours) is loaded."""
    import vllm.plugins

    lines = _Lines()
    vllm.plugins.logger.addHandler(lines)
    try:
        assert ROUTE in _routes(monkeypatch, None)
    finally:
        vllm.plugins.logger.removeHandler(lines)
    assert not [x for x in lines.lines if "Found endpoint plugin(s)" in x], lines.lines
