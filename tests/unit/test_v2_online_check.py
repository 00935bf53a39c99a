"""The online wiring check on vLLM's Model Runner V2 (GPU vLLM's default runner), with V2's real classes.

Guards the bug of issue 38: the check wrapped only V1's ``GPUModelRunner.propose_draft_token_ids``; V2's runner
(``vllm/v1/worker/gpu/model_runner.py``) has no such method, so a GPU server logged "scoring 11 wirings" and never
scored. Now the check wraps V2's ``EagleSpeculator.propose`` (and ``sample_tokens`` around it, for the step's finished
requests; vllm_eagle3/online/runners.py) and, where the serving runner has no hook, is ``off`` with the reason (one
WARNING, an ``off`` report), never on and idle.

These tests install the hook on V2's real classes, check the hook row against V2's real signatures and fields, build
a V2 step from V2's own state objects (``InputBatch``, ``RequestState``, ``SamplingStates``, ``ExecuteModelState``) and
record it with the real ``Checker``. V2's whole step loop serving with the check runs in
tests/e2e/test_model_runner_v2.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_eagle3.spec import EMBED
from vllm_eagle3.wiring_check import CheckConfig

pytestmark = pytest.mark.unit

H = 8
CANDIDATES = (
    SimpleNamespace(taps=(EMBED, 3, 31), why="configured", label="[embed, 3, 31]"),
    SimpleNamespace(taps=(3, 31, 59), why="the incident", label="[3, 31, 59]"),
)


def _plan(**cfg):
    from vllm_eagle3.online.plan import CheckPlan

    return CheckPlan(CheckConfig(**cfg), CANDIDATES, (59,))


def _v2_runner_class():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner


def test_install_wraps_v2s_real_classes_once():
    """V2's ``EagleSpeculator.propose`` and ``GPUModelRunner.sample_tokens`` are wrapped (V1's
    ``propose_draft_token_ids`` too), keep their signatures, and a second install changes nothing: without this a V2
    server's check never sees a step."""
    import inspect

    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner as V1

    from vllm_eagle3.online import engine_hook

    done = engine_hook.install()
    assert done.startswith("installed") and "V2 EagleSpeculator.propose" in done, done
    v2 = _v2_runner_class()
    wrapped, propose = v2.sample_tokens, EagleSpeculator.propose
    assert getattr(wrapped, engine_hook._MARK, False) and getattr(V1.propose_draft_token_ids, engine_hook._MARK)
    assert getattr(propose, engine_hook._MARK, False)
    assert list(inspect.signature(wrapped).parameters) == ["self", "grammar_output"]
    assert list(inspect.signature(propose).parameters)[:7] == list(engine_hook.RUNNERS["V2"].params)
    assert engine_hook.install() == done and v2.sample_tokens is wrapped and EagleSpeculator.propose is propose


def test_v2_hook_row_matches_v2s_real_signatures():
    """The V2 row's method, parameters and the fields its rows read exist on the installed vLLM; a row whose
    parameters moved is refused with the fix instead of wrapping a method it would misread."""
    from vllm_eagle3.online.runners import RUNNERS

    assert RUNNERS["V2"].problem() is None and RUNNERS["V1"].problem() is None
    moved = dataclasses.replace(RUNNERS["V2"], params=("self", "scheduler_output"))
    assert "no longer starts with ('self', 'scheduler_output')" in moved.problem()
    gone = dataclasses.replace(RUNNERS["V2"], method="propose_draft_token_ids")
    missing = "no vllm.v1.worker.gpu.spec_decode.eagle.speculator.EagleSpeculator.propose_draft_token_ids"
    assert missing in gone.problem()
    outer_gone = dataclasses.replace(RUNNERS["V2"], outer=("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "x"))
    assert "GPUModelRunner.x on this vLLM" in outer_gone.problem()


def test_runner_in_use_is_vllms_own_rule(monkeypatch):
    """The check reads ``VllmConfig.use_v2_model_runner`` (env ``VLLM_USE_V2_MODEL_RUNNER``, else V2 where Triton
    works: not on vLLM-CPU), so it judges the runner vLLM really builds."""
    from vllm.config import VllmConfig

    from vllm_eagle3.online.runners import runner_in_use

    cfg = VllmConfig()
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert runner_in_use(cfg) == ("V2" if cfg.use_v2_model_runner else "V1") == "V1"  # no Triton backend on CPU
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert runner_in_use(cfg) == "V2"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert runner_in_use(cfg) == "V1"


@pytest.fixture
def vllm_cpu_shims(monkeypatch):
    """vLLM-CPU's worker imports ``vllm.v1.worker.cpu.shm`` (CPU stand-ins for CUDA streams, events, pinned and UVA
    buffers) before it builds a runner; V2's state objects need them on CPU. Applied for one test, then undone: the
    attributes get their values back, and a module this fixture imported leaves ``sys.modules`` again (else the next
    import of vLLM-CPU's worker in this process would find it imported and install no stand-ins)."""
    import importlib
    import sys

    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.worker.gpu.buffer_utils as gpu_buffer_utils

    for owner, names in (
        (torch, ("Event",)),
        (torch.cuda, ("Event", "Stream", "set_stream", "current_stream", "stream")),
        (torch.accelerator, ("synchronize", "empty_cache", "get_memory_info")),
        (torch.Tensor, ("pin_memory", "record_stream")),
        (torch_utils, ("async_tensor_h2d",)),
        (gpu_buffer_utils, ("UvaBuffer",)),
    ):
        for name in names:
            monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    imported_here = "vllm.v1.worker.cpu.shm" not in sys.modules
    import vllm.v1.worker.cpu.shm as shm

    importlib.reload(shm)
    yield
    if imported_here:
        del sys.modules["vllm.v1.worker.cpu.shm"]


def _v2_step(aux):
    """A real V2 step of two requests, as V2 lays it out (verify rows first): ``b`` verifies 3 drafts at positions
    20..23 and 1 is accepted (2 tokens sampled); ``a`` prefills its 10-token prompt at positions 0..9 (1 sampled)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.model_runner import ExecuteModelState
    from vllm.v1.worker.gpu.sample.states import SamplingStates
    from vllm.v1.worker.gpu.states import RequestState

    states = RequestState(
        max_num_reqs=4,
        max_model_len=256,
        max_num_batched_tokens=64,
        num_speculative_steps=3,
        vocab_size=512,
        device=torch.device("cpu"),
    )
    sampling = SamplingStates(4, 512)
    for rid, prompt, computed, max_tokens, temp in (("a", 10, 0, 5, 0.0), ("b", 12, 20, 100, 0.2)):
        states.add_request(rid, prompt, list(range(computed or prompt)), computed, max_tokens)
        sampling.add_request(states.req_id_to_index[rid], SamplingParams(temperature=temp, max_tokens=max_tokens))
    n = 14
    batch = InputBatch.make_dummy(
        2, n, InputBuffers(max_num_reqs=4, max_num_tokens=64, device=torch.device("cpu")), is_padding=False
    )
    batch = dataclasses.replace(
        batch,
        req_ids=["b", "a"],
        idx_mapping_np=np.array([states.req_id_to_index[r] for r in ("b", "a")]),
        num_scheduled_tokens=np.array([4, 10], dtype=np.int32),
        query_start_loc_np=np.array([0, 4, 14], dtype=np.int32),
        num_draft_tokens_per_req=np.array([3, 0], dtype=np.int32),
    )
    batch.input_ids.copy_(torch.arange(100, 100 + n))
    batch.positions.copy_(torch.tensor([20, 21, 22, 23] + list(range(10))))
    state = ExecuteModelState(
        input_batch=batch,
        attn_metadata=None,
        slot_mappings_by_layer=None,
        hidden_states=torch.zeros(n, H),
        aux_hidden_states=aux,
        dp_sync_state=None,
        finished_req_ids=set(),
        ec_connector_output=None,
        cudagraph_stats=None,
        num_spec_tokens_to_schedule=3,
    )
    runner = object.__new__(_v2_runner_class())  # V2's class; its __init__ needs CUDA streams
    runner.req_states, runner.execute_model_state = states, state
    runner.sampler = SimpleNamespace(sampling_states=sampling)  # V2's Sampler holds more; the check reads this
    # propose's arguments, as sample_tokens passes them (tokens sampled per request: b 2, a 1)
    return runner, {
        "input_batch": batch,
        "aux_hidden_states": aux,
        "num_sampled": torch.tensor([2, 1], dtype=torch.int32),
        "dummy_run": False,
    }


def test_a_v2_step_becomes_the_rows_the_check_records(vllm_cpu_shims):
    """From V2's own state objects: each request's rows, confirmed count (verify: tokens sampled; prefill: all), first
    position, prompt length, temperature and token limit; then the Checker follows both requests and records exactly
    their confirmed rows with the taps of the aux list V2 hands the draft. A wrong field (e.g. the padded query length
    for a verify step, another request's slot) records the wrong positions, which the draft would be scored on."""
    from vllm_eagle3.online.engine_hook import Checker
    from vllm_eagle3.online.runners import RUNNERS

    aux = [torch.arange(14 * H, dtype=torch.float32).reshape(14, H) + 1000 * t for t in range(3)]
    runner, args = _v2_step(aux)
    row = RUNNERS["V2"]
    kept = row.keep(runner)
    runner.execute_model_state = None  # what V2's sample_tokens does before it samples
    step = row.rows(runner, kept, args, {59: aux[2] * -1})
    assert step.req_ids == ("b", "a") and step.query_start == (0, 4, 14)
    assert step.device_rows() == ([2, 10], [20, 0])  # confirmed rows, first positions
    assert step.prompt_len == (12, 10) and step.max_len == (112, 15)
    assert step.temperature == pytest.approx((0.2, 0.0)) and step.aux[1] is aux[1]

    checker = Checker(_plan(sample_every=1, max_temperature=0.3), None, 0, 3, 61, None)
    checker.observe(runner, step)
    traces = checker.tracker.traces
    assert set(traces) == {"a", "b"}
    tokens, taps = traces["b"].materialize()
    assert traces["b"].start == 20 and tokens.tolist() == [100, 101]
    assert torch.equal(taps[EMBED], aux[0][:2]) and torch.equal(taps[31], aux[2][:2])
    assert torch.equal(taps[59], -aux[2][:2])  # the check's extra tap, as the hook took it off the aux list
    tokens, taps = traces["a"].materialize()
    assert traces["a"].start == 0 and tokens.tolist() == list(range(104, 114)) and torch.equal(taps[3], aux[1][4:])


def test_the_wrapper_on_v2s_class_runs_v2s_own_method(tmp_path, monkeypatch):
    """Calling V2's wrapped ``sample_tokens`` on a V2 runner runs V2's own body (here its no-step path) and consults
    the check once per runner: a wrapper that swallowed the call would stop serving."""
    from vllm_eagle3.online import engine_hook

    engine_hook.install()
    runner = object.__new__(_v2_runner_class())
    steps = []
    runner.execute_model_state = None
    runner.speculator = SimpleNamespace()  # a speculating runner: the check is consulted
    runner.eplb = SimpleNamespace(step=lambda **kw: steps.append(kw))  # V2's step_eplb_after runs after the body
    runner.get_model = lambda: SimpleNamespace(check_plan=None)
    assert runner.sample_tokens(None) is None
    assert steps == [{"is_dummy": False, "is_profile": False}] and runner.__dict__[engine_hook._MARK] is None


def _config(v2: bool, worker: str = "auto"):
    return SimpleNamespace(
        use_v2_model_runner=v2,
        speculative_config=SimpleNamespace(num_speculative_tokens=3),
        parallel_config=SimpleNamespace(worker_cls=worker, data_parallel_rank=0),
    )


def test_check_is_off_with_the_reason_where_v2_has_no_hook(tmp_path, monkeypatch, caplog):
    """V2 serving and its hook missing (a vLLM whose ``sample_tokens`` moved): the plan is off with the reason, one
    WARNING says so at start-up and the report the endpoint reads says ``off``, never an enabled check that idles."""
    from vllm_eagle3.online import engine_hook
    from vllm_eagle3.online.runners import RUNNERS
    from vllm_eagle3.wiring_check import read_reports

    engine_hook.install()
    monkeypatch.setenv("EAGLE3_CHECK_DIR", str(tmp_path))
    # What the check sees on a vLLM whose V2 propose takes other parameters than its row relies on.
    monkeypatch.setitem(RUNNERS, "V2", dataclasses.replace(RUNNERS["V2"], params=("self", "scheduler_output")))
    monkeypatch.delitem(engine_hook._INSTALLED, "V2")
    why = "EagleSpeculator.propose(self, input_batch"
    assert engine_hook.attach(_plan(), _config(v2=False)).enabled  # V1 serves: its hook is in place
    with caplog.at_level(logging.WARNING, logger="vllm.vllm_eagle3.check"):
        plan = engine_hook.attach(_plan(), _config(v2=True))
    assert not plan.enabled and why in plan.off_because and "Model Runner V2" in plan.off_because
    assert plan.extra_taps == ()  # nothing extra captured for a check that will not run
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0], warnings
    report = read_reports()["0"]
    assert report["verdict"] == "off" and why in report["off_because"]
    assert report["configured"]["taps"] == "[embed, 3, 31]"  # the gauges' labels are there
    assert json.loads((tmp_path / "engine0.json").read_text())["verdict"] == "off"


def test_check_is_off_on_a_runner_it_does_not_know(tmp_path, monkeypatch):
    """An out-of-tree worker builds a runner that is neither V1's nor V2's: the check cannot see its steps, so it is
    off and says which worker."""
    from vllm_eagle3.online import engine_hook

    monkeypatch.setenv("EAGLE3_CHECK_DIR", str(tmp_path))
    plan = engine_hook.attach(_plan(), _config(v2=True, worker="my_platform.worker.NPUWorker"))
    assert not plan.enabled and "my_platform.worker.NPUWorker" in plan.off_because


def test_the_capture_models_plan_goes_through_the_runner_check(tmp_path, monkeypatch):
    """``online.plan.plan_check`` (run when vLLM asks the target for its aux states, in every worker) consults the
    runner check: the shipped pair planned for a V2 engine whose hook is missing is off, not "scoring 11 wirings"."""
    from vllm_eagle3.online.plan import plan_check
    from vllm_eagle3.online import engine_hook
    from vllm_eagle3.online.runners import RUNNERS
    from vllm_eagle3.resolve import resolve_capture

    repo = Path(__file__).resolve().parents[2]
    target, draft = repo / "models" / "kimi-k25-mini", repo / "models" / "kimi-k25-mini-eagle3"
    resolution = resolve_capture(target, draft, repo / "configs" / "kimi_k25_eagle3.yaml")
    monkeypatch.setenv("EAGLE3_CHECK_DIR", str(tmp_path))
    config = _config(v2=True)
    config.parallel_config.pipeline_parallel_size = 1
    config.speculative_config.model = str(draft)
    config.additional_config = {}
    engine_hook.install()
    assert plan_check(resolution, config).enabled  # V2's hook in place: the check runs
    monkeypatch.setitem(RUNNERS, "V2", dataclasses.replace(RUNNERS["V2"], method="propose_draft_token_ids"))
    monkeypatch.delitem(engine_hook._INSTALLED, "V2")
    plan = plan_check(resolution, config)
    assert not plan.enabled and "EagleSpeculator.propose_draft_token_ids on this vLLM" in plan.off_because


def test_steps_of_requests_already_passed_over_do_not_wait_for_the_device(vllm_cpu_shims):
    """Reading a V2 step's sampled counts waits for its kernels (a GPU sync that async scheduling is built to avoid):
    the check reads them only when a request is followed or new, never in a step of requests it passed over."""
    from vllm_eagle3.online.engine_hook import Checker
    from vllm_eagle3.online.runners import RUNNERS

    aux = [torch.zeros(14, H) for _ in range(3)]
    runner, args = _v2_step(aux)
    row = RUNNERS["V2"]
    step = row.rows(runner, row.keep(runner), args, {})
    checker = Checker(_plan(sample_every=1, max_temperature=0.1), None, 0, 3, 61, None)
    checker.observe(runner, step)
    assert set(checker.tracker.traces) == {"a"} and checker.tracker.too_hot == 1  # b (temperature 0.2) passed over

    def no_sync():
        raise AssertionError("read the device for a step of requests already passed over")

    only_b = dataclasses.replace(step, req_ids=("b",), query_start=(0, 4), device_rows=no_sync)
    checker.observe(runner, only_b)
