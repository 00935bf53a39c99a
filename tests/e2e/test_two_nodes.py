"""Two vLLM nodes on one host: TP=2 over ``--nnodes 2``, one worker per node, the spec only in vLLM's config.

Kimi K2.5 is served across hosts with vLLM's multiprocessing executor: node 0 runs ``vllm serve ... --nnodes 2
--node-rank 0 --master-addr A``, node 1 the same with ``--node-rank 1 --headless`` (workers only). Here both nodes
are processes of this host (vllm_eagle3/testing/nodes.py), each bound to a core of its own, talking over loopback;
they share nothing but the command line (configs/serve_kimi_k25_mini.yaml, whose ``additional-config`` carries the
capture spec) and torch.distributed. Bugs guarded:

1. **A node without the spec.** The spec reached workers as a file path in an environment variable, so every node
   needed the same file at the same path; a node without it serves the draft other taps or refuses. Here no
   ``EAGLE3_SPEC`` / ``EAGLE3_CONVENTION`` is set on either node: each node's worker must log the taps
   ``[embed, 3, 31]`` with ``--additional-config`` as their source, naming its own TP rank.
2. **Speculation changing output across nodes** (taps or drafts wrong on the headless node's rank): greedy token ids
   over the two nodes must equal one node's (the session's ``plugin`` server: the same target, head, spec and k,
   TP=1), and the acceptance must match it.
3. **vLLM's warning about the project's variables** ("Unknown vLLM environment variable detected"): neither node
   logs it.

ONE two-node start (~100 s on a 2-core box: both nodes load the miniature at once), queried once; the one-node
reference is the pooled ``plugin`` server (tests/conftest.py), started here only if no earlier module did.
Greedy identity is exact: float32, and TP=2 vs TP=1 only re-associates float32 sums, which flips no greedy token on
these prompts (tests/e2e/test_serving.py ``test_tp2_served_acceptance_matches_tp1`` serves the same prompts at TP=2).
"""

from __future__ import annotations

import json

import pytest
import yaml

from vllm_eagle3.resolve import CONFIG_SPEC_SOURCE
from vllm_eagle3.testing.nodes import NodeGroup, one_core_per_node
from vllm_eagle3.testing.serving import greedy_mismatch, greedy_token_ids_together
from vllm_eagle3.testing.shipped import DRAFT, MODEL_NAME, REPO, SERVE_CONFIG, TARGET, eagle3_config
from vllm_eagle3.tools.serve.metrics import SpecDecodeCounters

pytestmark = pytest.mark.e2e

NNODES = 2
TP = 2  # one worker per node
NUM_PROMPTS = 4
MAX_TOKENS = 64
ACCEPTANCE_TOL = 0.1  # tokens per step: the same drafts, up to a near-tie flipped by TP's float32 re-association
PROJECT_ENV_PREFIXES = ("EAGLE3_", "VLLM_EAGLE3_")
"""The project's variables (new and deprecated names, the spec channel among them): unset on both nodes, so the
config alone carries the spec and the nodes run the project's defaults whatever the developer's shell says."""


def say(line: str) -> None:
    print(f"[two nodes] {line}", flush=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """The first held-out prompts (token ids) the head's eval.json was measured on, as tests/e2e/test_serving.py."""
    items = json.loads((DRAFT / "eval_prompts.json").read_text())["items"]
    return [list(map(int, it["prompt_token_ids"])) for it in items[:NUM_PROMPTS]]


def served(server, prompts) -> tuple[list[list[int]], SpecDecodeCounters]:
    """Greedy token ids of ``prompts`` (one completions request) and the spec-decode counters over it."""
    before = SpecDecodeCounters.fetch(server.base_url)
    ids = greedy_token_ids_together(server, MODEL_NAME, prompts, MAX_TOKENS)
    return ids, SpecDecodeCounters.fetch(server.base_url) - before


@pytest.fixture(scope="module")
def one_node(server_pool, shipped_keys, prompts) -> dict:
    """The session's ``plugin`` server (`vllm-eagle3 serve`, the same pair, TP=1) on the same prompts."""
    server = server_pool.get(shipped_keys["plugin"])
    ids, counters = served(server, prompts)
    say(f"one node (TP=1): {counters.summary()}")
    return dict(ids=ids, counters=counters)


@pytest.fixture(scope="module")
def two_nodes(session_env, prompts, one_node) -> dict:
    """The shipped pair over two nodes (TP=2, one worker each): plain `vllm serve`, the spec from the serve
    config's additional-config only, the same head and k as the one-node server."""
    env = {k: v for k, v in session_env.items() if not k.startswith(PROJECT_ENV_PREFIXES)}
    env.pop("VLLM_PLUGINS", None)
    # The serve config's own plugin mapping (its spec) with live k and the per-request draft back-off off, as the
    # one-node server runs: acceptance is compared at one fixed k with every request drafting (live k's sweep drafts
    # k = 0..5 by measured step times, and the k mix moves acceptance length). The spec still reaches every node only
    # through vLLM's --additional-config.
    plugin = yaml.safe_load(SERVE_CONFIG.read_text())["additional-config"]
    plugin["vllm_eagle3"].update(live_k=False, draft_backoff=False)
    args = [
        str(TARGET),
        "--config",
        str(SERVE_CONFIG),
        "--speculative-config",
        eagle3_config(DRAFT),
        "--additional-config",
        json.dumps(plugin),
        "--tensor-parallel-size",
        str(TP),
    ]
    group = NodeGroup(args, NNODES, env=env, node_env=one_core_per_node, cwd=REPO)
    say(f"starting {NNODES} nodes: {' '.join(group.head.command())} (logs {[str(n.log_path) for n in group.nodes]})")
    group.start()
    try:
        startup = group.wait_ready(timeout=900, progress=say)
        ids, counters = served(group.head, prompts)
        still_running = [n.rank for n in group.nodes if n.alive()]
    finally:
        codes = group.stop()
    say(f"ready after {startup:.1f} s; {counters.summary()}; exit codes {codes}")
    return dict(ids=ids, counters=counters, logs=group.logs(), running=still_running)


def test_each_node_runs_its_own_tp_rank(two_nodes):
    """The deployment really spans two nodes: node 0 leads a 2-rank world with 1 local worker, node 1 runs vLLM's
    headless executor, each node's log has exactly one worker (its TP rank), both alive after serving."""
    head, other = two_nodes["logs"]
    assert two_nodes["running"] == [0, 1], f"nodes running after the requests: {two_nodes['running']}"
    assert "DP group leader: node_rank=0" in head and "world_size=2, local_world_size=1" in head, head[-3000:]
    assert "headless multiproc executor" in other, other[-3000:]
    for rank, log in enumerate(two_nodes["logs"]):
        assert f"(Worker_TP{rank} pid=" in log and f"(Worker_TP{1 - rank} pid=" not in log, (
            f"node {rank} should run TP rank {rank} only:\n{log[-3000:]}"
        )


@pytest.mark.parametrize("rank", range(NNODES))
def test_each_node_takes_the_spec_from_vllms_config(two_nodes, rank):
    """Node ``rank``'s worker captures [embed, 3, 31] with the spec from --additional-config (no env var, no file on
    that node), and names its TP rank: a node that lost the spec, or read another one, shows here."""
    log = two_nodes["logs"][rank]
    lines = [x for x in log.splitlines() if "vllm-eagle3: capturing taps" in x]
    assert len(lines) == 1, f"node {rank}: expected one taps line (its one worker), got {lines or log[-3000:]}"
    assert "capturing taps [embed, 3, 31]" in lines[0] and f"[tp {rank}/{TP}, pp 0/1, pid " in lines[0], lines[0]
    assert f"spec from {CONFIG_SPEC_SOURCE}" in lines[0], lines[0]


@pytest.mark.parametrize("rank", range(NNODES))
def test_no_unknown_vllm_variable_warning(two_nodes, rank):
    """Neither node logs vLLM's "Unknown vLLM environment variable" warning (the project's old VLLM_EAGLE3_*
    names did, on every start; with vLLM's fail-on-unknown setting the node would refuse to start)."""
    warned = [x for x in two_nodes["logs"][rank].splitlines() if "Unknown vLLM environment variable" in x]
    assert not warned, warned


def test_greedy_identical_to_one_node(two_nodes, one_node):
    """EAGLE-3 over two nodes gives one node's greedy token ids (float32), and the draft was consulted."""
    assert len({t for r in one_node["ids"] for t in r}) > 8, f"degenerate reference {one_node['ids']}"
    mismatch = greedy_mismatch(two_nodes["ids"], one_node["ids"])
    assert mismatch is None, f"two nodes vs one node: {mismatch}"
    assert two_nodes["counters"].drafts > 0, "no drafts counted over two nodes: the speculative path did not run"


def test_acceptance_matches_one_node(two_nodes, one_node):
    """The same drafts are accepted over two nodes: a tap wrong on the headless node's rank (its half of every
    sharded draft layer fed other hidden states) would keep the greedy output but cost acceptance."""
    two, one = two_nodes["counters"], one_node["counters"]
    say(f"acceptance length: two nodes {two.acceptance_length:.3f}, one node {one.acceptance_length:.3f}")
    assert one.drafts >= 50, f"only {one.drafts:.0f} drafts on one node: too few to compare"
    assert abs(two.acceptance_length - one.acceptance_length) <= ACCEPTANCE_TOL, (two.summary(), one.summary())
