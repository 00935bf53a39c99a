"""The runtime wiring watch on a real `vllm-eagle3 serve` server: the incident is caught while serving, the right
wiring is left alone, and each shipped head served with the other's wiring is caught. Three servers from the
session's pool (tests/conftest.py; this module runs before the other modules that use ``incident`` and ``plugin``,
whose whole log and window it judges), all eager and float32:

- ``incident``: the shipped head served with taps [3, 31, 59] (a draft-folder copy whose config ids [2, 30, 58] are
  read sglang-legacy, and a capture spec ``taps: [3, 31, 59]`` in a tmp dir - what tests/e2e/test_serving.py calls
  the incident). Every static check passes; only served acceptance shows it. The watch must log ONE warning
  within 16 requests and ``GET /v1/eagle3/wiring`` must say ``wrong``.
- ``right``: the shipped head with configs/kimi_k25_eagle3.yaml ([embed, 3, 31]) for 64 requests: no warning, the
  endpoint says ``ok``.
- ``second head, first wiring``: the head trained on taps [3, 31, 59] (models/kimi-k25-mini-eagle3-taps-3-31-59)
  served with the FIRST head's wiring: a copy of its folder whose config says [-1, 2, 30] and the first head's own
  spec configs/kimi_k25_eagle3.yaml ([embed, 3, 31], sglang-legacy ids). The watch must say wrong within 16 requests
  against the SECOND head's eval.json (the copy links it), not the first's. The reverse case (the first head with
  the second's [3, 31, 59]) is ``incident``. No server for the second head on its own wiring: its served acceptance
  is pinned by tests/e2e/test_serving.py's walk comparison and the doctor, and a fourth start-up would cost CI
  ~3 min for a case the watch's unit tests already cover (same code, another eval.json).

The route is an endpoint plugin: vLLM loads it when ``VLLM_PLUGINS`` names it, and the engine patch
``vllm_eagle3/model_patches/vllm_endpoint_default.py`` loads it when ``VLLM_PLUGINS`` is unset; the servers here start
with none, as a user's would.
With ``EAGLE3_WATCH_EXAMPLE=docs/wiring_watch_example.txt`` the test writes the warning line and the
endpoint bodies it saw there (how docs/wiring_watch_example.txt was made).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3 import verdicts
from vllm_eagle3.tools.serve.process import VllmServer, http_get

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SECOND = REPO / "models" / "kimi-k25-mini-eagle3-taps-3-31-59"  # trained on taps [3, 31, 59]
RIGHT_SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
MODEL_NAME = "kimi-k25-mini"
MAX_TOKENS = 32
IN_FLIGHT = 8
WARNING_MARK = f"vllm-eagle3 wiring watch [engine 0]: {verdicts.heading(verdicts.WRONG)}: "
EXAMPLE_ENV = "EAGLE3_WATCH_EXAMPLE"

pytestmark = [pytest.mark.e2e]
if not all((d / "config.json").is_file() for d in (TARGET, DRAFT, SECOND)):
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built ({TARGET}, {DRAFT}, {SECOND})"))


def say(line: str) -> None:
    print(f"[e2e] {line}", flush=True)


def prompts(n: int, draft: Path = DRAFT) -> list[list[int]]:
    """Held-out prompts as token ids (eval_prompts.json, the ones the head's eval.json was measured on), cycled."""
    items = json.loads((draft / "eval_prompts.json").read_text())["items"]
    return [list(map(int, items[i % len(items)]["prompt_token_ids"])) for i in range(n)]


def fresh(server_pool, key) -> VllmServer:
    """The pooled server for ``key``, started anew if it has served a draft already: these tests judge the watch
    over a server's whole life ("one warning within 16 requests")."""
    server = server_pool.get(key)
    engines = wiring(server)[0]["engines"]
    if engines and engines[0]["window"]["drafts_since_start"] > 0:
        say(f"server {key.name!r} has served before this test: restarting it")
        server_pool.stop(key)
        server = server_pool.get(key)
    return server


def complete(server: VllmServer, batch: list[list[int]]) -> float:
    from openai import OpenAI

    client = OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)

    def one(p):
        client.completions.create(
            model=MODEL_NAME, prompt=p, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
        )

    t0 = time.monotonic()
    with ThreadPoolExecutor(IN_FLIGHT) as ex:
        list(ex.map(one, batch))
    return time.monotonic() - t0


def wiring(server: VllmServer) -> tuple[dict, str]:
    status, body = http_get(server.base_url + "/v1/eagle3/wiring")
    assert status == 200, f"GET /v1/eagle3/wiring -> {status}: {body[:500]}"
    return json.loads(body), body


def gauges(server: VllmServer) -> dict[str, float]:
    text = http_get(server.base_url + "/metrics")[1]
    return {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm_eagle3_wiring_") and "position=" not in line and "_info{" not in line
    }


@pytest.fixture(scope="module")
def example() -> dict:
    """What the runs saw, written to $EAGLE3_WATCH_EXAMPLE at the end (when set)."""
    seen: dict = {}
    yield seen
    out = os.environ.get(EXAMPLE_ENV)
    if out and seen:
        path = (REPO / out) if not os.path.isabs(out) else Path(out)
        parts = [
            "# Copied by tests/e2e/test_wiring_watch.py from its servers' logs and endpoint (not typed).",
            f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; shipped miniature, eager, float32, k=3; "
            f"heads {DRAFT.name} and {SECOND.name}.",
            "",
        ]
        if "warning" in seen:
            parts += [
                "## The warning line (incident wiring: the shipped head served with taps [3, 31, 59])",
                "",
                seen["warning"],
                "",
            ]
        if "second_warning" in seen:
            parts += [
                "## The warning line (the head trained on [3, 31, 59] served with the first head's [embed, 3, 31])",
                "",
                seen["second_warning"],
                "",
            ]
        for name in ("incident", "right", "second"):
            if name in seen:
                parts += [f"## GET /v1/eagle3/wiring ({seen[name]['what']})", "", seen[name]["body"], ""]
        path.write_text("\n".join(parts))
        say(f"wrote {path}")


@pytest.fixture(scope="module")
def second_head_first_wiring(tmp_path_factory) -> Path:
    """The second head's weights (and eval.json, linked) with a config naming the first head's ids [-1, 2, 30]
    (sglang-legacy = [embed, 3, 31]) and no trainer record: the first head's wiring, which every static check
    accepts for this folder."""
    from vllm_eagle3.tools.convert import rewired_copy

    return rewired_copy(
        SECOND, tmp_path_factory.mktemp("second") / "kimi-k25-mini-eagle3-taps-3-31-59-first-wiring", [-1, 2, 30]
    )


def test_second_head_with_the_first_heads_wiring_is_caught(
    server_pool, second_head_first_wiring, example, record_property
):
    """Guards: a watch that only knows the first head. The head trained on [3, 31, 59] served with the first head's
    spec ([embed, 3, 31]) must read wrong within 16 requests, with ONE warning, judged against ITS OWN eval.json
    (position-0 expectation = its served walk, which differs from the first head's in the 3rd decimal)."""
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    draft = second_head_first_wiring
    server = fresh(
        server_pool, ServerKey.of("second head, first wiring", shipped_server_argv(draft, RIGHT_SPEC), SERVER_ENV)
    )
    log = server.log_text()
    assert "vllm-eagle3 wiring watch [engine 0]: on; taps [embed, 3, 31]" in log, (
        "the watch's start-up line is missing from the server log (stat-logger plugin not loaded?)"
    )
    dt = complete(server, prompts(16, SECOND))
    body, raw = wiring(server)
    time.sleep(1.0)
    lines = [line for line in server.log_text().splitlines() if WARNING_MARK in line]
    metrics = gauges(server)
    engine = body["engines"][0]
    say(
        f"16 requests in {dt:.1f} s; verdict {body['verdict']}; window {engine['window']}; "
        f"expected {engine['expected']}"
    )
    record_property("second_head_window_position0", engine["window"]["position0"])
    own, first = served_walk_p0(SECOND), served_walk_p0(DRAFT)
    assert round(own, 4) != round(first, 4), "the two heads' recorded expectations no longer differ: pick another check"
    assert engine["expected"]["position0"] == round(own, 4), (engine["expected"], own, first)
    assert f"(= {SECOND / 'eval.json'})" in engine["expected"]["source"], engine["expected"]["source"]
    assert len(lines) == 1, f"expected one wiring warning in the server log, got {len(lines)}: {lines}"
    line = lines[0]
    for part in (
        "WARNING",
        "taps [embed, 3, 31]",
        f"from {engine['wiring']['source']}.",
        f"vs {own:.3f} expected (",
        f"vllm-eagle3 doctor --target {TARGET} --draft {draft}",
    ):
        assert part in line, (part, line)
    assert body["verdict"] == verdicts.WRONG and engine["verdict"] == verdicts.WRONG, raw
    assert engine["window"]["position0"] < engine["expected"]["wrong_below"]
    assert metrics.get("vllm_eagle3_wiring_verdict") == verdicts.level(verdicts.WRONG), metrics
    example["second_warning"] = line
    example["second"] = {
        "what": "the head trained on [3, 31, 59] with the first head's [embed, 3, 31], after 16 requests",
        "body": json.dumps(body, indent=1),
    }


def test_incident_wiring_is_caught_while_serving(server_pool, shipped_keys, incident_files, example, record_property):
    """Guards: the incident served silently. The shipped head with taps [3, 31, 59] passes every static check and
    serves at ~1.0 tokens per step; the watch must log exactly ONE warning within 16 requests naming the taps, their
    source, measured vs expected acceptance and the doctor command, and the endpoint and gauges must say wrong.
    """
    server = fresh(server_pool, shipped_keys["incident"])
    log = server.log_text()
    assert "vllm-eagle3 wiring watch [engine 0]: on; taps [3, 31, 59]" in log, (
        "the watch's start-up line is missing from the server log (stat-logger plugin not loaded?)"
    )
    dt = complete(server, prompts(16))
    body, raw = wiring(server)
    say(f"16 requests in {dt:.1f} s; verdict {body['verdict']}; window {body['engines'][0]['window']}")
    time.sleep(1.0)  # the log file is written by the server process
    lines = [line for line in server.log_text().splitlines() if WARNING_MARK in line]
    metrics = gauges(server)
    record_property("incident_window_position0", body["engines"][0]["window"]["position0"])
    assert len(lines) == 1, f"expected one wiring warning in the server log, got {len(lines)}: {lines}"
    line = lines[0]
    assert "WARNING" in line, line
    engine = body["engines"][0]
    for part in (
        "taps [3, 31, 59]",
        f"from {engine['wiring']['source']}.",
        "expected (",
        f"vllm-eagle3 doctor --target {TARGET} --draft {incident_files['draft']}",
    ):
        assert part in line, (part, line)
    assert body["verdict"] == verdicts.WRONG and engine["verdict"] == verdicts.WRONG, raw
    assert engine["wiring"]["taps"] == "[3, 31, 59]" and engine["lines_logged"] >= 1
    assert engine["window"]["position0"] < engine["expected"]["wrong_below"]
    assert engine["expected"]["position0"] == round(served_walk_p0(DRAFT), 4), engine["expected"]
    assert metrics.get("vllm_eagle3_wiring_verdict") == verdicts.level(verdicts.WRONG), metrics
    example["warning"] = line
    example["incident"] = {"what": "incident wiring, after 16 requests", "body": json.dumps(body, indent=1)}


def test_right_wiring_is_left_alone(server_pool, shipped_keys, example, record_property):
    """Guards: false alarms. The shipped head with its own spec [embed, 3, 31] serves 64 requests: no wiring
    line in the log, verdict ok, the window's position-0 acceptance above the costs threshold; the online wiring
    check raises nothing either."""
    server = fresh(server_pool, shipped_keys["plugin"])
    dt = complete(server, prompts(64))
    body, raw = wiring(server)
    time.sleep(1.0)
    log = server.log_text()
    metrics = gauges(server)
    engine = body["engines"][0]
    say(f"64 requests in {dt:.1f} s; verdict {body['verdict']}; window {engine['window']}")
    record_property("right_window_position0", engine["window"]["position0"])
    assert "vllm-eagle3 wiring watch [engine 0]: on; taps [embed, 3, 31]" in log
    assert not verdicts.ALARM_LINE.search(log), [line for line in log.splitlines() if verdicts.ALARM_LINE.search(line)]
    assert body["verdict"] == verdicts.OK and engine["verdict"] == verdicts.OK, raw
    assert engine["window"]["drafts"] >= engine["config"]["min_drafts"]
    assert engine["expected"]["position0"] == round(served_walk_p0(DRAFT), 4), engine["expected"]
    assert engine["window"]["position0"] > engine["expected"]["costs_below"]
    assert engine["lines_logged"] == 0 and metrics.get("vllm_eagle3_wiring_verdict") == verdicts.level(verdicts.OK), (
        metrics
    )
    # the online wiring check, on by default, followed 1 in 4 of these requests: no false alarm
    check = body["check"]["0"]
    say(f"online check: {check['verdict']} after {check['requests']} scored requests, cost {check['cost']}")
    assert (
        check["verdict"] in (verdicts.OK, verdicts.UNDECIDED, verdicts.PENDING)
        and check["configured"]["taps"] == "[embed, 3, 31]"
    ), check
    assert check["requests"] >= 8, check
    example["right"] = {"what": "right wiring [embed, 3, 31], after 64 requests", "body": json.dumps(body, indent=1)}


def served_walk_p0(draft: Path) -> float:
    """The position-0 expectation the watch must read for ``draft``: its eval.json's served walk at k=1."""
    walk = json.loads((draft / "eval.json").read_text())["simulated_acceptance"]["served_walk"]["1"]
    return walk["accepted"] / walk["drafts"]
