"""The shipped miniature served for real: `vllm-eagle3 serve` (vLLM's own `vllm serve` + the plugin) and the
OpenAI client over loopback. The incident is the regression this file exists for.

Servers (from the session's pool, tests/conftest.py: ``plugin``, ``baseline`` and ``incident`` are the same
processes test_wiring_watch.py and test_sampling_options.py use; counters are read as before/after deltas):
- ``baseline``: the miniature target alone (``--speculative-config None``): the reference greedy outputs.
- ``plugin``: target + EAGLE-3 head with the plugin's spec ``[embed, 3, 31]`` (configs/serve_kimi_k25_mini.yaml +
  configs/kimi_k25_eagle3.yaml), exactly what `make demo` serves.
- ``incident``: the same head wired the way stock vLLM / legacy SGLang read it (a draft-config copy with ids
  [2, 30, 58] in sglang-legacy = taps [3, 31, 59], spec ``taps: [3, 31, 59]``): the incident's wiring.
- ``plugin_tp2``: ``plugin`` with ``--tensor-parallel-size 2`` (one core per rank): served acceptance under TP.

All servers run float32, eager, greedy. Numbers measured here are printed (run pytest with ``-s``) and attached to
the test report as properties.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters, parse_prometheus
from vllm_eagle3.tools.serve.process import VllmServer, http_get

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
MODEL_NAME = "kimi-k25-mini"  # served-model-name in the serve config

NUM_PROMPTS = 8  # x 128 tokens: >= 250 drafts per server at acceptance length ~3.4 (the comparisons need >= 100)
MAX_TOKENS = 128  # eval.json's greedy continuations are 128 tokens
START_TIMEOUT_S = 900  # eager start-up measured 30-130 s on a loaded 2-core box; generous for CI
IN_FLIGHT = 8  # concurrent requests while measuring outputs and acceptance
LOAD_CLIENTS = 32
LOAD_ROUNDS = 2  # requests per client: 64 in all, 16 of them hung up mid-stream (a fixed count, not a duration)
LOAD_MAX_TOKENS = 32
DISCONNECT_EVERY = 4  # every 4th request of each load client hangs up after a few chunks
# TP=2 on vLLM-CPU: one core per rank, none reserved (docs/serving-on-cpu.md; tests/e2e/test_tensor_parallel.py).
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
TP_ACCEPTANCE_TOL = 0.05

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "config.json").is_file():
    pytestmark.append(
        pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET} and {DRAFT}); these tests serve it")
    )


def say(line: str) -> None:
    print(f"[e2e] {line}", flush=True)


# ------------------------------------------------------------------------------------------------- prompts


def eval_prompts(n: int = NUM_PROMPTS) -> list[list[int]] | None:
    """The first ``n`` prompts (token ids) the model card's offline acceptance was measured on, or None.

    ``eval_prompts.json`` (written by ``vllm_eagle3.miniature.evaluate`` next to ``eval.json``) holds held-out
    Python prompts as token ids; replaying the ids (not re-tokenised text) makes served and offline numbers
    describe the same text.
    """
    path = DRAFT / "eval_prompts.json"
    if not path.is_file():
        return None
    items = json.loads(path.read_text())["items"]
    return [list(map(int, it["prompt_token_ids"])) for it in items[:n]]


def heldout_prompts(n: int = NUM_PROMPTS, chars: int = 400) -> list[str]:
    """Fallback for a checkpoint without eval_prompts.json: ``n`` text prompts from held-out stdlib files (the
    miniature's own split), each ~``chars`` characters starting at a line boundary a third into the file."""
    from vllm_eagle3.miniature import data

    stdlib = data.default_roots()[0]
    _, held = data.split_files(data.source_files([stdlib]))
    prompts = []
    for f in held:
        try:
            text = f.path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 3 * chars:
            continue
        start = text.find("\n", len(text) // 3) + 1
        window = text[start : start + chars]
        window = window[: window.rfind("\n") + 1]
        if window.strip():
            prompts.append(window)
        if len(prompts) == n:
            break
    assert len(prompts) == n, f"only {len(prompts)} held-out files of {chars * 3}+ characters under {stdlib}"
    return prompts


# ------------------------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def pool(server_pool, shipped_keys):
    """``pool.get(name)``: the session's shared servers (tests/conftest.py) plus this module's TP=2 server."""
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    keys = {
        **shipped_keys,
        "plugin_tp2": ServerKey.of(
            "plugin_tp2", [*shipped_server_argv(), "--tensor-parallel-size", "2"], {**SERVER_ENV, **TP2_ENV}
        ),
    }

    class Pool:
        def get(self, name: str) -> VllmServer:
            return server_pool.get(keys[name])

    return Pool()


@pytest.fixture(scope="module")
def prompts() -> list:
    return eval_prompts() or heldout_prompts()


def client_for(server: VllmServer):
    from openai import OpenAI

    return OpenAI(base_url=server.openai_url, api_key="EMPTY", max_retries=0, timeout=300)


def greedy_outputs(server: VllmServer, prompts: list, max_tokens: int = MAX_TOKENS) -> tuple[list[str], float]:
    """Greedy completions of ``prompts`` (text or token ids; IN_FLIGHT at a time, no EOS stop): the texts and the
    aggregate tokens/s."""
    client = client_for(server)

    def one(p):
        r = client.completions.create(
            model=MODEL_NAME, prompt=p, max_tokens=max_tokens, temperature=0.0, extra_body={"ignore_eos": True}
        )
        return r.choices[0].text, r.usage.completion_tokens

    t0 = time.perf_counter()
    with ThreadPoolExecutor(IN_FLIGHT) as ex:
        results = list(ex.map(one, prompts))
    dt = time.perf_counter() - t0
    return [t for t, _ in results], sum(n for _, n in results) / dt


def measure(server: VllmServer, prompts: list) -> tuple[list[str], SpecDecodeCounters, float]:
    before = SpecDecodeCounters.fetch(server.base_url)
    texts, tps = greedy_outputs(server, prompts)
    return texts, SpecDecodeCounters.fetch(server.base_url) - before, tps


@pytest.fixture(scope="module")
def reference(pool, prompts) -> list[str]:
    """Greedy outputs of the target alone."""
    texts, tps = greedy_outputs(pool.get("baseline"), prompts)
    say(f"baseline: {len(texts)} prompts x {MAX_TOKENS} tokens, {tps:.1f} tok/s ({IN_FLIGHT} in flight)")
    return texts


@pytest.fixture(scope="module")
def reference_short(pool, prompts, reference) -> list[str]:
    """Greedy outputs of the target alone at the load test's length."""
    return greedy_outputs(pool.get("baseline"), prompts, LOAD_MAX_TOKENS)[0]


@pytest.fixture(scope="module")
def served(pool, prompts, reference, reference_short) -> dict:
    """The plugin server's greedy outputs and acceptance over the held-out prompts."""
    texts, counters, tps = measure(pool.get("plugin"), prompts)
    say(f"plugin [embed, 3, 31]: {tps:.1f} tok/s ({IN_FLIGHT} in flight); {counters.summary()}")
    return {"texts": texts, "counters": counters, "tps": tps}


# ------------------------------------------------------------------------------------------------- model card


def offline_acceptance(k: int, num_prompts: int) -> tuple[float, int, str]:
    """The model card's offline estimate of what a server measures on the first ``num_prompts`` eval prompts at
    ``k`` draft tokens: (acceptance length, drafts, where it was read).

    ``eval.json`` (``vllm_eagle3.miniature.evaluate``): ``simulated_acceptance.served_walk`` = the head's chain
    drafts scored against the target's float32 greedy continuation of each prompt, visited the way vLLM visits
    them (draft after prefill, accept the leading matches a, draft again a + 1 tokens later), per prompt.
    """
    path = DRAFT / "eval.json"
    assert path.is_file(), f"{path} is missing: the model card's offline estimate ships with the draft"
    sim = json.loads(path.read_text())["simulated_acceptance"]
    assert "served_walk" in sim, (
        f"{path} has no simulated_acceptance.served_walk: run `python -m "
        "vllm_eagle3.miniature.evaluate --target ... --draft ... --walk-only`"
    )
    per = sim["served_walk"][str(k)]["per_sequence"][:num_prompts]
    assert len(per) == num_prompts, f"{path}: served_walk has {len(per)} prompts, {num_prompts} served"
    drafts, accepted = sum(d for d, _ in per), sum(a for _, a in per)
    every = sim["greedy"]["acceptance_length"][str(k)]
    return (
        1.0 + accepted / drafts,
        drafts,
        f"{path.name}: simulated_acceptance.served_walk, k={k}, first {num_prompts} prompts, {drafts} drafts; "
        f"every-anchor average over all prompts {every:.3f}",
    )


# ------------------------------------------------------------------------------------------------- tests


def test_speculative_greedy_is_token_identical(served, reference, record_property):
    """Guards: speculation changing what the model says (a wrong accept/reject or KV-cache bookkeeping bug shows
    up as a different greedy continuation). float32 on both sides: exact, no tolerance."""
    mismatched = [i for i, (a, b) in enumerate(zip(reference, served["texts"])) if a != b]
    record_property("greedy_mismatches", len(mismatched))
    assert not mismatched, (
        f"{len(mismatched)}/{len(reference)} greedy outputs differ with speculation; first: "
        f"prompt {mismatched[0]}:\n--- target alone\n{reference[mismatched[0]]!r}\n"
        f"--- with EAGLE-3\n{served['texts'][mismatched[0]]!r}"
    )


def test_served_acceptance_matches_model_card(served, prompts, record_property):
    """Guards: the served wiring differing from the training wiring in any way the static checks miss (tap
    order, embedding source, d2t). The served acceptance length must equal the model card's offline simulation of
    the same serving walk on the same prompts.

    Tolerance: |served - offline| <= 0.1 tokens per step (of 1..4 with 3 draft tokens, ~3%). Both sides see the
    same token ids (eval_prompts.json), the same float32 greedy continuation (test above: speculation does not
    change it) and the same head (vLLM's draft logits equal the training code's to ~1e-5:
    tests/parity/test_draft_parity.py), so they count the same drafts, except (a) the last one or two drafts of
    each prompt, whose chains run past the 128 known tokens and which the simulation cannot score (~1 of ~40
    drafts per prompt; measured 660 simulated vs 677 served drafts), and (b) argmax near-ties between the engines'
    float32 kernels (rare). Measured: served 3.046 vs simulated 3.029. The every-anchor average (3.317) is NOT
    the comparison: a server drafts more often where drafts fail (short advances), so it counts more hard anchors.
    The incident's wiring is ~2 tokens below (see the gap test).
    """
    counters: SpecDecodeCounters = served["counters"]
    k = len(counters.accepted_per_pos)
    offline, drafts, where = offline_acceptance(k, len(prompts))
    record_property("served_acceptance_length", round(counters.acceptance_length, 4))
    record_property("offline_acceptance_length", round(offline, 4))
    say(
        f"served acceptance length {counters.acceptance_length:.3f} ({counters.drafts:.0f} drafts) vs offline "
        f"{offline:.3f} ({where}); served per position {[round(x, 3) for x in counters.per_position]}"
    )
    assert counters.drafts >= 100, f"only {counters.drafts:.0f} drafts measured: too few to compare"
    assert abs(counters.acceptance_length - offline) <= 0.1, (
        f"served acceptance length {counters.acceptance_length:.3f} is not within 0.1 of the model card's "
        f"simulation {offline:.3f} ({where})"
    )
    per_pos = counters.per_position
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), f"per-position acceptance not decreasing: {per_pos}"


def test_under_load_nothing_lost_or_corrupted(pool, prompts, reference_short, served, record_property):
    """Guards: requests lost, mixed up or truncated under concurrency with client disconnects (scheduler /
    speculative-batch bookkeeping bugs), and a server left unhealthy or with leaked running requests.

    32 streaming clients, LOAD_ROUNDS requests each, on loopback; every DISCONNECT_EVERY-th request of each client
    hangs up after 3 chunks (a quarter of the clients on their first request, another quarter on their second). Every
    request that finishes must equal the target's greedy output for its prompt; what a hung-up request received must
    be a prefix of it. How fast the server is under this load is the benchmark's business (make bench).
    """
    server = pool.get("plugin")
    lock = threading.Lock()
    stats = {"completed": 0, "disconnected": 0, "errors": 0, "mismatches": 0, "tokens": 0}
    problems: list[str] = []

    def worker(cid: int) -> None:
        client = client_for(server)
        n = 0
        while n < LOAD_ROUNDS:
            i = (cid + n * LOAD_CLIENTS) % len(prompts)
            hang_up = (cid + n) % DISCONNECT_EVERY == 0  # a quarter of the clients hang up on their first request
            n += 1
            try:
                stream = client.completions.create(
                    model=MODEL_NAME,
                    prompt=prompts[i],
                    max_tokens=LOAD_MAX_TOKENS,
                    temperature=0.0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                parts, chunks, tokens = [], 0, 0
                for chunk in stream:
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                    for c in chunk.choices:
                        parts.append(c.text or "")
                    chunks += 1
                    if hang_up and chunks >= 3:
                        stream.close()
                        break
                text = "".join(parts)
                with lock:
                    if hang_up:
                        stats["disconnected"] += 1
                        if not reference_short[i].startswith(text):
                            stats["mismatches"] += 1
                            problems.append(
                                f"client {cid} prompt {i} (hung up): {text!r} is not a prefix of {reference_short[i]!r}"
                            )
                    else:
                        stats["completed"] += 1
                        stats["tokens"] += tokens
                        if text != reference_short[i]:
                            stats["mismatches"] += 1
                            problems.append(f"client {cid} prompt {i}: {text!r} != {reference_short[i]!r}")
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    stats["errors"] += 1
                    problems.append(f"client {cid} prompt {i}: {type(exc).__name__}: {exc}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(LOAD_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    elapsed = time.monotonic() - t0
    assert not any(t.is_alive() for t in threads), "a load client hung"

    # Afterwards: healthy, nothing left running (disconnected requests were aborted), still correct.
    running = float("nan")
    for _ in range(60):
        samples = parse_prometheus(http_get(server.base_url + "/metrics")[1])
        running = sum(v for _, v in samples.get("vllm:num_requests_running", []))
        waiting = sum(v for _, v in samples.get("vllm:num_requests_waiting", []))
        if running == 0 and waiting == 0:
            break
        time.sleep(1)
    healthy = server.healthy()
    after, _ = greedy_outputs(server, prompts[:2], LOAD_MAX_TOKENS)

    report = {
        **stats,
        "clients": LOAD_CLIENTS,
        "seconds": round(elapsed, 1),
        "tokens_per_s": round(stats["tokens"] / elapsed, 1),
        "running_after": running,
        "healthy_after": healthy,
    }
    for key, value in report.items():
        record_property(f"load_{key}", value)
    say(f"load test: {json.dumps(report)}")
    assert stats["errors"] == 0 and stats["mismatches"] == 0, "\n".join(problems[:10])
    hang_ups = sum((c + n) % DISCONNECT_EVERY == 0 for c in range(LOAD_CLIENTS) for n in range(LOAD_ROUNDS))
    assert stats["completed"] == LOAD_CLIENTS * LOAD_ROUNDS - hang_ups, f"only {stats['completed']} requests completed"
    assert stats["disconnected"] > 0, "no client disconnected mid-stream: the test did not test that"
    assert healthy and running == 0, f"after load: healthy={healthy}, requests still running={running}"
    assert after == reference_short[:2], "greedy outputs changed after the load test"


def test_incident_wiring_collapses_acceptance(pool, prompts, reference, served, record_property):
    """Guards: THE incident. The same trained head fed taps [3, 31, 59] (SGLang's/vLLM's default capture, what the
    draft config's ids [2, 30, 58] mean to stock engines) instead of [embed, 3, 31] serves without any error - and
    without any speedup. If this test fails, the wiring no longer matters, i.e. the plugin's capture is not
    actually reaching the draft (the "fix" would be cosmetic).

    Asserted gap: the incident's acceptance length must be at least 0.5 tokens per step below the correct
    wiring's, and its draft-token acceptance rate at most half of it (both far beyond the measurement noise of
    ~0.1 discussed in the model-card test). Greedy outputs are still identical: the incident is silent.
    """
    texts, counters, tps = measure(pool.get("incident"), prompts)
    good: SpecDecodeCounters = served["counters"]
    record_property("incident_acceptance_length", round(counters.acceptance_length, 4))
    record_property("incident_tokens_per_s", round(tps, 1))
    say(f"incident [3, 31, 59]: {tps:.1f} tok/s (plugin {served['tps']:.1f}); {counters.summary()}")
    say(
        f"gap: acceptance length {good.acceptance_length:.3f} (plugin) vs {counters.acceptance_length:.3f} "
        f"(incident wiring)"
    )
    assert counters.drafts >= 100
    assert counters.acceptance_length <= good.acceptance_length - 0.5, (
        f"incident wiring acceptance {counters.acceptance_length:.3f} is not clearly below the correct wiring's "
        f"{good.acceptance_length:.3f}"
    )
    assert counters.acceptance_rate <= 0.5 * good.acceptance_rate
    assert texts == reference, "greedy output changed under the incident wiring (it should only be slow)"


def test_tp2_served_acceptance_matches_tp1(pool, prompts, reference, served, record_property):
    """Guards: a tap that is right on one process but wrong under tensor parallelism (an embedding tap taken as a
    vocab shard's partial sum, a layer tap before its all-reduce) - the draft would still run, only worse. The
    TP=2 server (same config, ``--tensor-parallel-size 2``) must serve the same greedy text and the same
    acceptance as the TP=1 ``plugin`` server on the same prompts.

    Tolerance: |acceptance length TP=2 - TP=1| <= 0.05 tokens per step. Both servers run float32 greedy on the same
    token ids, so the drafts can differ only where TP's re-associated float32 sums (~1e-6 relative, see
    test_tensor_parallel.py) flip a draft argmax with a near-tie - a handful of ~1000+ drafts. A shard-partial tap
    zeroes half the embedding rows and costs far more (the incident's wrong taps cost > 0.5, asserted below).
    """
    texts, counters, tps = measure(pool.get("plugin_tp2"), prompts)
    tp1: SpecDecodeCounters = served["counters"]
    record_property("tp2_acceptance_length", round(counters.acceptance_length, 4))
    say(f"plugin TP=2: {tps:.1f} tok/s (TP=1 {served['tps']:.1f}); {counters.summary()}")
    say(f"acceptance length TP=2 {counters.acceptance_length:.3f} vs TP=1 {tp1.acceptance_length:.3f}")
    log = pool.get("plugin_tp2").log_text()
    rank_lines = [line for line in log.splitlines() if "vllm-eagle3: capturing taps [embed, 3, 31]" in line]
    assert any("[tp 0/2," in line for line in rank_lines) and any("[tp 1/2," in line for line in rank_lines), (
        f"expected a taps line from each of the 2 TP ranks, got {rank_lines}"
    )
    assert counters.drafts >= 100, f"only {counters.drafts:.0f} drafts measured: too few to compare"
    # the online wiring check (on by default) runs once per engine, on TP rank 0, with the taps gathered there
    checks = [line for line in log.splitlines() if "vllm-eagle3 wiring check: scoring" in line]
    assert len(checks) == 1, f"one online-check start-up line (TP rank 0) expected, got {checks}"
    status, raw = http_get(pool.get("plugin_tp2").base_url + "/v1/eagle3/wiring")
    check = json.loads(raw)["check"].get("0") if status == 200 else None
    assert check and check["anchors"] > 0 and check["verdict"] in ("pending", "undecided", "ok"), (
        f"the online check did not score (or raised an alarm) under TP=2: {status} {raw[:2000]}"
    )
    assert texts == reference, "greedy output under TP=2 + EAGLE-3 differs from the target alone"
    assert abs(counters.acceptance_length - tp1.acceptance_length) <= TP_ACCEPTANCE_TOL, (
        f"TP=2 acceptance length {counters.acceptance_length:.3f} differs from TP=1's {tp1.acceptance_length:.3f} "
        f"by more than {TP_ACCEPTANCE_TOL}"
    )
