"""The shipped miniature pair's files and serve command lines, as the tests start them (test support).

Data flow position: names only. ``shipped_server_argv`` is the `make demo` server (configs/serve_kimi_k25_mini.yaml,
the shipped head, capture spec [embed, 3, 31]) with another draft / spec when given; the session's server pool keys
servers by these argv, so equal argv = one shared process.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SERVE_CONFIG = REPO / "configs" / "serve_kimi_k25_mini.yaml"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
MODEL_NAME = "kimi-k25-mini"  # served-model-name in the serve config
SERVER_ENV: dict[str, str | None] = {"EAGLE3_SKIP_PATCHES": None, "VLLM_PLUGINS": None}
"""Pooled servers of the shipped pair run with every patch and the default plugin list, whatever the developer's
shell says (a test that leaves a patch out starts its own server)."""


def eagle3_config(draft: Path, k: int = 3) -> str:
    """``--speculative-config`` JSON for an EAGLE-3 ``draft`` with ``k`` draft tokens."""
    return json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})


def shipped_server_argv(draft: Path | None = DRAFT, spec: Path | None = SPEC, draft_backoff: bool = False) -> list[str]:
    """`vllm-eagle3 serve` argv: the shipped serve config with ``draft`` and capture ``spec`` (``draft=None``: the
    target alone). The model is positional, so it wins over the config's relative ``model:``. ``draft_backoff``: the
    plugin's per-request draft back-off with its defaults (vllm_eagle3/request_speculation.py), else off."""
    argv = [
        str(TARGET),
        "--config",
        str(SERVE_CONFIG),
        "--speculative-config",
        eagle3_config(draft) if draft else "None",
    ]
    if not (draft and spec):
        return argv
    # The shipped config's own plugin mapping (its spec, live_k) is replaced: the spec by ``spec`` (serve refuses two
    # different specs), live k by the fixed k above. A test's drafts must not depend on how busy the box is
    # (live_k moves k by measured step times); tests/e2e/test_live_k_serving.py serves live k. The per-request draft
    # back-off is off too: these servers measure a head's acceptance (against its model card, or the incident wiring's
    # collapse), which a back-off that pauses a failing request's drafts would thin out;
    # tests/e2e/test_request_speculation.py serves the back-off.
    plugin = {"vllm_eagle3": {"live_k": False, "draft_backoff": draft_backoff}}
    return argv + ["--additional-config", json.dumps(plugin), "--capture-spec", str(spec)]
