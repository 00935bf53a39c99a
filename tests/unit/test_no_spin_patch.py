"""The vLLM-CPU no-spin patch (vllm_eagle3/model_patches/vllm_cpu_no_spin.py): a reader of vLLM's shared-memory
message queue sleeps between looks instead of spinning on sched_yield, and messages still arrive, in order.

Guards a patch that stopped applying (the reader would spin again), and one that made a reader miss a message (the
round trip below would not finish).
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def patched() -> str:
    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_cpu_no_spin

    return model_patches.apply(vllm_cpu_no_spin.PATCH, "0.32.0")


def test_waiting_reader_sleeps_instead_of_yielding(patched, monkeypatch):
    """Inside vLLM's busy window a reader's wait sleeps POLL_S (vLLM: sched_yield, at once back on an idle core)."""
    import time

    from vllm.distributed.device_communicators import shm_broadcast

    from vllm_eagle3.model_patches import vllm_cpu_no_spin

    assert "vllm_cpu_no_spin" in patched
    slept, yielded = [], []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(shm_broadcast, "sched_yield", lambda: yielded.append(1))
    reader = shm_broadcast.SpinCondition.__new__(shm_broadcast.SpinCondition)  # no sockets: the busy window only
    reader.is_reader, reader.busy_loop_s, reader.last_read = True, 1.0, time.monotonic()
    reader.wait(timeout_ms=0)
    assert slept == [vllm_cpu_no_spin.POLL_S] and not yielded


def test_messages_arrive_in_order_through_a_waiting_reader(patched):
    """A reader thread dequeues 50 messages while the main thread enqueues them, through the patched wait."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    writer = MessageQueue(n_reader=1, n_local_reader=1)
    handle = writer.export_handle()
    got: list[object] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            reader = MessageQueue.create_from_handle(handle, 0)
            reader.wait_until_ready()
            got.extend(reader.dequeue() for _ in range(50))
        except BaseException as exc:  # reported by the main thread
            failed.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    writer.wait_until_ready()
    for i in range(50):
        writer.enqueue({"step": i})
    thread.join(timeout=120)  # a hang guard only: the assertions are on what arrived
    assert not failed, failed
    assert got == [{"step": i} for i in range(50)], f"{len(got)} of 50 messages arrived"
