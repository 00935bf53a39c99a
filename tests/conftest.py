"""Shared fixtures: tiny checkpoints (built once per session), the session's server pool; the suite's glue.

Engines are expensive on the 2-core CI box (~30-90 s each even with ``enforce_eager``). Servers are shared by the
whole session (``server_pool``, keyed by argv + env: the shipped pair as `make demo` serves it is started once for
every module that asks for it); offline engines are started once per configuration in a fixture, one at a time.

`make test` runs the suite on two pytest-xdist workers (``-n 2``), each worker's engines bound to a core of their
own. Which tests share a worker, in what order, and the durations that order comes from (``tests/durations.json``,
rewritten at the end of each whole-suite run) are :mod:`vllm_eagle3.testing.suite`'s; the hooks here apply them.
Plain ``pytest`` runs the same order on one process.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vllm_eagle3.testing import suite

REPO = Path(__file__).resolve().parents[1]
SESSION_ENV: dict[str, str] = {}
"""The environment before any in-process engine ran (vLLM leaves its own LD_PRELOAD in os.environ): every pooled
server starts from it, so a server is the same whichever test started it. Taken in :func:`pytest_configure`."""


def pytest_configure(config):
    """The suite's environment, inherited by every engine the tests spawn; under xdist each worker's engines get a
    core of their own (vLLM-CPU's "auto" would bind both workers' engines to the same last core; TP=2 tests set
    "0|1" themselves)."""
    for key, value in suite.SUITE_ENV.items():
        os.environ.setdefault(key, value)
    worker = getattr(config, "workerinput", None)
    if worker is not None and int(worker["workercount"]) > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(worker["workerid"][2:]) % (os.cpu_count() or 1)))
    SESSION_ENV.clear()
    SESSION_ENV.update(os.environ)
    if worker is None and suite.whole_suite(
        config.args,
        config.getoption("markexpr"),
        config.getoption("keyword"),
        Path(config.invocation_params.dir),
        Path(__file__).parent,
    ):
        config.pluginmanager.register(DurationsPlugin(config), "vllm_eagle3_durations")


def pytest_collection_modifyitems(config, items):
    """Groups longest first, modules within a group in their table's order (:func:`suite.order`). Tests marked
    ``slow`` (the 10-minute soak, measurements) run only when selected: ``pytest -m slow``."""
    keys = suite.order((item.nodeid for item in items), suite.Durations())  # repo-relative, as the scheduler sees
    items.sort(key=lambda item: keys[item.nodeid])
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist hands out whole groups (:func:`suite.group_of`) in collection order (``--no-loadscope-reorder``).
    Kept because xdist's ``--dist loadgroup`` rewrites node ids, which pytest 9.2 no longer allows (pytest-xdist
    3.8): its ``xdist_group`` marks then put a group's tests on both workers."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return suite.group_of(nodeid)

    return GroupScheduling(config, log)


class DurationsPlugin:
    """In the controller of a whole-suite run: every test's seconds (the workers' reports arrive here), written to
    ``tests/durations.json`` at the end when the tests ran (exit status 0 or 1)."""

    def __init__(self, config) -> None:
        self.config, self.recorder = config, suite.Recorder()

    def pytest_runtest_logreport(self, report) -> None:
        self.recorder.add(report.nodeid, report.duration)

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if int(exitstatus) not in (0, 1) or not self.recorder.seconds:
            return
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        self.recorder.write(suite.DURATIONS, self.config.getoption("numprocesses", None) or 1, commit)


@pytest.fixture(scope="session")
def session_env() -> dict[str, str]:
    """:data:`SESSION_ENV` (a copy), for tests that start their own server."""
    return dict(SESSION_ENV)


@pytest.fixture(scope="session")
def server_pool():
    """The session's servers (vllm_eagle3/testing/pool.py): at most three alive, the least recently used stopped."""
    from vllm_eagle3.testing.pool import ServerPool

    pool = ServerPool(SESSION_ENV, REPO, say=lambda line: print(f"[servers] {line}", flush=True))
    yield pool
    pool.stop_all()
    print(
        f"[servers] start-up times (s): {json.dumps({k: [round(x, 1) for x in v] for k, v in pool.startup_s.items()})}"
    )


@pytest.fixture(scope="session")
def shipped_keys(incident_files):
    """The shipped pair's pooled servers: ``plugin`` (what `make demo` serves), ``baseline`` (the target alone),
    ``incident`` (the shipped head fed taps [3, 31, 59])."""
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    return {
        "plugin": ServerKey.of("plugin", shipped_server_argv(), SERVER_ENV),
        "baseline": ServerKey.of("baseline", shipped_server_argv(None), SERVER_ENV),
        "incident": ServerKey.of(
            "incident", shipped_server_argv(incident_files["draft"], incident_files["spec"]), SERVER_ENV
        ),
    }


TAP_LAYERS = 32  # >= 32 so taps 3 and 31 of the shipped head exist


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def dsv3_dir(tiny_root) -> Path:
    """A random 32-layer DeepSeek-V3 (MLA + MoE), float32."""
    from vllm_eagle3.testing.tiny import build_deepseek_v3

    return build_deepseek_v3(tiny_root / "dsv3", num_layers=TAP_LAYERS)


@pytest.fixture(scope="session")
def kimi_dir(tiny_root) -> Path:
    """A random Kimi K2.5 (32-layer DeepSeek-V3 text model + 1-layer vision tower), float32."""
    from vllm_eagle3.testing.tiny import build_kimi_k25

    return build_kimi_k25(tiny_root / "kimi", num_layers=TAP_LAYERS)


OFFLINE_PROMPTS = ("def fibonacci(n):\n    if n < 2:\n", "import os\nimport sys\n\n\nclass ")
OFFLINE_MAX_TOKENS = 32


@pytest.fixture(scope="session")
def dsv3_eagle3_run(dsv3_dir, make_draft, tmp_path_factory) -> dict:
    """ONE offline engine for two modules: the tiny DeepSeek-V3 + a Llama-style EAGLE-3 draft (config ids [0, 3, 31],
    vLLM convention) + a spec [embed, 3, 31]. Returns what each module checks, the engine stopped:
    ``prefill_taps`` (the aux list the runner received for the prefill of ``prompt_ids()``: test_capture_vllm),
    ``greedy`` (greedy token ids of :data:`OFFLINE_PROMPTS`, :data:`OFFLINE_MAX_TOKENS` each: test_offline_eagle3),
    ``log`` (the start-up log), ``spec`` (the spec file's path)."""
    from vllm import SamplingParams

    from vllm_eagle3.testing.engine import prompt_ids, start_engine, stop_engine
    from vllm_eagle3.testing.taps import prefill_taps
    from vllm_eagle3.testing.tiny import write_spec_yaml

    spec = write_spec_yaml(
        tmp_path_factory.mktemp("spec") / "kimi_like.yaml", ["embed", 3, 31], num_layers=32, draft_ids_convention="vllm"
    )
    engine = start_engine(dsv3_dir, make_draft(dsv3_dir, [0, 3, 31]), env={"EAGLE3_SPEC": str(spec)})
    try:
        taps = prefill_taps(engine, prompt_ids())
        params = SamplingParams(max_tokens=OFFLINE_MAX_TOKENS, temperature=0.0, ignore_eos=True)
        outs = engine.llm.generate(
            [{"prompt_token_ids": prompt_ids(p)} for p in OFFLINE_PROMPTS], params, use_tqdm=False
        )
        log = engine.log()
    finally:
        stop_engine(engine)
    return {
        "prefill_taps": taps,
        "greedy": [list(o.outputs[0].token_ids) for o in outs],
        "log": log,
        "spec": str(spec),
        "startup_s": engine.startup_s,
        "prompts": OFFLINE_PROMPTS,
        "max_tokens": OFFLINE_MAX_TOKENS,
    }


@pytest.fixture(scope="session")
def make_draft(tiny_root):
    """``make_draft(target_dir, ids)`` -> a Llama-style EAGLE-3 draft folder whose config carries ``ids``."""
    from vllm_eagle3.testing.tiny import build_eagle3_draft

    def make(target: Path, ids: list[int], **kw: Any) -> Path:
        name = f"draft_{Path(target).name}_{'_'.join(str(i) for i in ids)}"
        folder = tiny_root / name
        if not (folder / "config.json").exists():
            build_eagle3_draft(folder, target, ids, **kw)
        return folder

    return make


@pytest.fixture
def target(tmp_path):
    """A 61-layer Kimi K2.5 target folder holding only config.json (hidden 128, vocab 4096): enough for the static
    checks, which read configs and safetensors headers only."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "text_config": {"num_hidden_layers": 61, "hidden_size": 128, "vocab_size": 4096},
            }
        )
    )
    return d


@pytest.fixture(scope="session")
def incident_files(tmp_path_factory) -> dict[str, Path]:
    """The shipped head's weights (and eval.json) with the incident's config: ids [2, 30, 58] read sglang-legacy =
    taps 3, 31, 59, no record of the trained taps, and a spec saying so: the incident's wiring, served."""
    from vllm_eagle3.tools.convert import rewired_copy

    root = tmp_path_factory.mktemp("incident")
    # The incident's config carried no trainer record of the taps (the shipped head's `vllm_eagle3.taps`, which the
    # static check compares with the spec): rewired_copy drops it, so only served acceptance can tell.
    from vllm_eagle3.testing.shipped import DRAFT

    draft = rewired_copy(DRAFT, root / "kimi-k25-mini-eagle3-incident", [2, 30, 58])
    spec = root / "incident_spec.yaml"
    spec.write_text(
        "description: the incident's wiring (SGLang's default capture, no embedding)\n"
        "taps: [3, 31, 59]\nnum_layers: 61\ndraft_ids_convention: sglang-legacy\n"
    )
    return {"draft": draft, "spec": spec}


# A head fed what it was trained on vs one that accepts ~nothing (wrong taps, a broken verify): the benchmark measured
# acceptance length 1.02 for the incident wiring; the retrained shipped head's served walk is 2.37 at k=3 on the card's
# prompts (MODEL_CARD.md), lower on short requests that end mid-draft. 1.5 separates the two with room on both sides.
ACCEPTED_FLOOR = 1.5


def _speculation_accepted(metrics: dict) -> float:
    """Drafts were proposed and the head was accepted (acceptance length > :data:`ACCEPTED_FLOOR`); returns it."""
    drafts = metrics.get("vllm:spec_decode_num_drafts", 0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens", 0)
    length = 1 + accepted / max(1, drafts)
    print(f"drafts {drafts}, accepted tokens {accepted}, acceptance length {length:.3f}")
    assert drafts > 0 and length > ACCEPTED_FLOOR, (
        f"acceptance length {length:.3f} over {drafts} drafts <= {ACCEPTED_FLOOR}: the head is not being accepted "
        f"(wrong taps or a broken verify); metrics {metrics}"
    )
    return length


@pytest.fixture
def assert_speculation_accepted():
    """``assert_speculation_accepted(metrics)``: the check above, for tests that read vLLM's spec-decode counters."""
    return _speculation_accepted
