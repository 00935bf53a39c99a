"""Shared fixtures: tiny checkpoints (built once per session), the session's server pool, the module order.

Engines are expensive on the 2-core CI box (~30-90 s each even with ``enforce_eager``). Servers are shared by the
whole session (``server_pool``, keyed by argv + env: the shipped pair as `make demo` serves it is started once for
every module that asks for it); offline engines are started once per configuration in a fixture, one at a time.
Modules run in :data:`MODULE_ORDER` so that modules sharing a server run back to back.

`make test` runs the suite on two pytest-xdist workers (``-n 2``): a worker gets whole groups of tests
(:data:`GROUPS`: modules that share a session's server or engine go to one worker together), the groups are handed
out longest first, and each worker's engines are bound to a core of their own
(``VLLM_CPU_OMP_THREADS_BIND``). Plain ``pytest`` runs the same order on one process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

# Every vLLM process inherits these (the engine core and workers are spawned from the test process).
for _k, _v in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # LLM.apply_model ships test-support functions (vllm_eagle3.testing.taps) to the worker and tensors back.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}.items():
    os.environ.setdefault(_k, _v)

# Under pytest-xdist (make test: two workers on two cores) each worker's engines get a core of their own; vLLM-CPU's
# "auto" would bind both workers' engines to the same last core. Tests that need both cores (TP=2) set "0|1".
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(_WORKER[2:]) % (os.cpu_count() or 1)))

SESSION_ENV = dict(os.environ)
"""The environment before any in-process engine ran (vLLM leaves its own LD_PRELOAD in os.environ): every pooled
server starts from it, so a server is the same whichever test started it."""

REPO = Path(__file__).resolve().parents[1]

MODULE_ORDER = (
    # the shipped pair's servers, in one stretch: the watch first (it judges a fresh server's whole log)
    "tests/e2e/test_wiring_watch.py", "tests/e2e/test_serving.py", "tests/e2e/test_sampling_options.py",
    "tests/e2e/test_offline_eagle3.py", "tests/parity/test_capture_vllm.py",  # the tiny DeepSeek-V3 + EAGLE-3 engine
)
"""Modules of one group run in this order (the rest after them, in pytest's order)."""


GROUPS: dict[str, tuple[float, tuple[str, ...]]] = {
    # group: (seconds it took on CI's 2-core box, its modules). Modules in one group share a session server or
    # engine (the shipped pair's pooled servers; the tiny DeepSeek-V3 + EAGLE-3 engine), so one worker runs them.
    "shipped pair servers": (580, ("tests/e2e/test_wiring_watch.py", "tests/e2e/test_serving.py",
                                   "tests/e2e/test_sampling_options.py")),
    "tiny DeepSeek-V3 + EAGLE-3 engine": (150, ("tests/e2e/test_offline_eagle3.py",
                                                "tests/parity/test_capture_vllm.py")),
}
"""Test groups a pytest-xdist worker runs whole (:func:`pytest_xdist_make_scheduler`); every other module is a group
of its own, and each case of ``test_serve_lifecycle.py`` too (each starts its own server)."""

MODULE_SECONDS = {
    # seconds per module on CI's 2-core box (junit of a fresh-clone `make test`, 2026-12-03): the order groups are
    # handed out in, longest first, so the last group to start is a short one. Unlisted modules count 40 s.
    "tests/e2e/test_compiled.py": 315, "tests/e2e/test_doctor.py": 182, "tests/e2e/test_images.py": 130,
    "tests/parity/test_draft_parity.py": 113, "tests/e2e/test_online_check.py": 110,
    "tests/parity/test_sglang_parity.py": 99, "tests/e2e/test_bf16.py": 98, "tests/parity/test_sglang_legacy.py": 86,
    "tests/e2e/test_four_taps.py": 79, "tests/e2e/test_mla_verify_decode.py": 70,
    "tests/e2e/test_k_per_batch_size.py": 66, "tests/e2e/test_mla_head.py": 65, "tests/unit/": 55,
    "tests/e2e/test_serve_lifecycle.py": 40,  # per case (8 cases, 319 s in all)
}
PER_CASE = ("tests/e2e/test_serve_lifecycle.py",)


def _group(nodeid: str) -> tuple[str, float]:
    """(group, its seconds) of a test, from its node id (``tests/e2e/test_x.py::test_y[case]``)."""
    path = nodeid.split("::")[0]
    for name, (seconds, modules) in GROUPS.items():
        if path in modules:
            return name, seconds
    seconds = next((v for k, v in MODULE_SECONDS.items() if path.startswith(k)), 40)
    if path in PER_CASE:
        return nodeid, seconds
    return ("tests/unit/" if path.startswith("tests/unit/") else path), seconds


def _module_rank(item) -> int:
    path = item.nodeid.split("::")[0]
    return next((i for i, prefix in enumerate(MODULE_ORDER) if path.startswith(prefix)), len(MODULE_ORDER))


def pytest_collection_modifyitems(config, items):
    """Groups longest first, modules within a group in :data:`MODULE_ORDER` (stable: pytest's order within them).
    Tests marked ``slow`` (the 10-minute soak, measurements) run only when selected: ``pytest -m slow``."""
    groups = {id(item): _group(item.nodeid) for item in items}  # repo-relative node ids, as the scheduler sees
    items.sort(key=lambda item: (-groups[id(item)][1], groups[id(item)][0], _module_rank(item)))
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist hands out whole :func:`_group` s, in collection order (run with ``--no-loadscope-reorder``).
    (xdist's own ``--dist loadgroup`` renames node ids, which pytest 9.2 no longer lets it do.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)[0]

    return GroupScheduling(config, log)


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
    print(f"[servers] start-up times (s): {json.dumps({k: [round(x, 1) for x in v] for k, v in pool.startup_s.items()})}")


@pytest.fixture(scope="session")
def shipped_keys(incident_files):
    """The shipped pair's pooled servers: ``plugin`` (what `make demo` serves), ``baseline`` (the target alone),
    ``incident`` (the shipped head fed taps [3, 31, 59])."""
    from vllm_eagle3.testing.pool import ServerKey
    from vllm_eagle3.testing.shipped import SERVER_ENV, shipped_server_argv

    return {
        "plugin": ServerKey.of("plugin", shipped_server_argv(), SERVER_ENV),
        "baseline": ServerKey.of("baseline", shipped_server_argv(None), SERVER_ENV),
        "incident": ServerKey.of("incident", shipped_server_argv(incident_files["draft"], incident_files["spec"]),
                                 SERVER_ENV),
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

    spec = write_spec_yaml(tmp_path_factory.mktemp("spec") / "kimi_like.yaml", ["embed", 3, 31], num_layers=32,
                           draft_ids_convention="vllm")
    engine = start_engine(dsv3_dir, make_draft(dsv3_dir, [0, 3, 31]), env={"EAGLE3_SPEC": str(spec)})
    try:
        taps = prefill_taps(engine, prompt_ids())
        params = SamplingParams(max_tokens=OFFLINE_MAX_TOKENS, temperature=0.0, ignore_eos=True)
        outs = engine.llm.generate([{"prompt_token_ids": prompt_ids(p)} for p in OFFLINE_PROMPTS], params,
                                   use_tqdm=False)
        log = engine.log()
    finally:
        stop_engine(engine)
    return {"prefill_taps": taps, "greedy": [list(o.outputs[0].token_ids) for o in outs], "log": log,
            "spec": str(spec), "startup_s": engine.startup_s, "prompts": OFFLINE_PROMPTS,
            "max_tokens": OFFLINE_MAX_TOKENS}


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
    (d / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": 128, "vocab_size": 4096}}))
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
    spec.write_text("description: the incident's wiring (SGLang's default capture, no embedding)\n"
                    "taps: [3, 31, 59]\nnum_layers: 61\ndraft_ids_convention: sglang-legacy\n")
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
        f"(wrong taps or a broken verify); metrics {metrics}")
    return length


@pytest.fixture
def assert_speculation_accepted():
    """``assert_speculation_accepted(metrics)``: the check above, for tests that read vLLM's spec-decode counters."""
    return _speculation_accepted
