"""What live k did in each benchmark cell. A server with ``live_k`` on shows its report at ``GET /v1/eagle3/wiring``
(:meth:`vllm_eagle3.live_k.LiveK.report`); ``run.py`` reads it before and after each cell and keeps, in the cell's
entry of results.json, the whole report after the cell plus what the pages show: the k that the bucket holding the
cell's concurrency ended on, and the changes of k during the cell. ``analysis.py`` and the pages read it back
(:func:`of_cell`, :func:`text`). A server without live k has ``"live_k": null``: nothing is read, nothing shown.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping

ROUTE = "/v1/eagle3/wiring"
NONE, NOT_RECORDED = "none", "not recorded"  # no live k on that server; a results file from before cells kept it
READS, READ_PAUSE_S = 5, 0.5  # the engine replaces its report file whole: a read that meets the swap is retried


def read(base_url: str, reads: int = READS, pause_s: float = READ_PAUSE_S) -> dict[str, Any] | None:
    """The server's live-k report (the endpoint's ``live_k``), None while it has none; transport errors raise."""
    import urllib.request

    for i in range(reads):
        with urllib.request.urlopen(base_url.rstrip("/") + ROUTE, timeout=30.0) as resp:  # noqa: S310 - loopback
            report = json.loads(resp.read().decode() or "{}").get("live_k")
        if report is not None or i == reads - 1:
            return report
        time.sleep(pause_s)
    return None


def snapshot(base_url: str) -> dict[str, Any] | str | None:
    """:func:`read`, or the error's text (a server that stopped answering loses its cell's record, not the run)."""
    try:
        return read(base_url)
    except Exception as exc:  # noqa: BLE001 - recorded in the cell
        return f"GET {ROUTE}: {type(exc).__name__}: {exc}"


def after_cell(base_url: str, before: Mapping | str | None, concurrency: int) -> dict[str, Any]:
    """The cell's record (:func:`cell_entry`) from ``before`` (:func:`snapshot` before the cell) and a read now."""
    after = snapshot(base_url)
    for when, got in (("before", before), ("after", after)):
        if isinstance(got, str):
            return {"report": None, "error": f"{got} ({when} the cell)"}
    return cell_entry(before, after, concurrency)  # type: ignore[arg-type]


def row_of(report: Mapping[str, Any] | None, concurrency: int) -> list[int] | None:
    """The report's table row ``[first batch size, last, k]`` that holds ``concurrency``, None if that bucket has not
    run (a bucket enters the table with its first step)."""
    return next((list(r) for r in (report or {}).get("table") or () if r[0] <= concurrency <= r[1]), None)


def cell_entry(before: Mapping | None, after: Mapping | None, concurrency: int) -> dict[str, Any]:
    """A live server's record of one cell: ``bucket`` (batch sizes) and ``k`` that the bucket holding the cell's
    concurrency ended on, ``k_before`` (None: the bucket had not run, it started from the configured table),
    ``changes`` of k in any bucket during the cell, ``steps_at_k`` drafted during the cell, and the whole ``report``.
    E.g. ``{"bucket": "27-38", "k": 3, "k_before": 2, "changes": 1, "steps_at_k": {"2": 190, "3": 24}, ...}``."""
    if after is None:
        return {"report": None, "error": "the server showed no live_k report after the cell"}
    row, was = row_of(after, concurrency), row_of(before, concurrency)
    steps, steps0 = after.get("steps_at_k") or {}, (before or {}).get("steps_at_k") or {}
    return {
        "bucket": f"{row[0]}-{row[1]}" if row else None,
        "k": row[2] if row else None,
        "k_before": was[2] if was else None,
        "changes": int(after.get("changes", 0)) - int((before or {}).get("changes", 0)),
        "steps_at_k": {k: n - steps0.get(k, 0) for k, n in steps.items() if n - steps0.get(k, 0)},
        "state": after.get("state"),
        "report": dict(after),
    }


def of_cell(cell: Mapping[str, Any], live: bool) -> dict[str, Any] | str:
    """What the pages show of a cell: :data:`NONE` (server without live k), :data:`NOT_RECORDED` (a live server's
    cell from a results file written before cells kept the report), else the entry less its report."""
    if not live:
        return NONE
    if "live_k" not in cell or cell["live_k"] is None:
        return NOT_RECORDED
    return {k: v for k, v in cell["live_k"].items() if k != "report"}


def text(o: Mapping[str, Any] | str | None) -> str:
    """``k=2 (0 changes)``, ``k 5->4 (1 change)``, ``none``, ``not recorded``, ``error: ...``."""
    if o is None or isinstance(o, str):
        return o or NONE
    if o.get("error"):
        return f"error: {o['error']}"
    if o.get("k") is None:
        return f"no step at this batch size ({o['changes']} changes)"
    n = o["changes"]
    k = f"k {o['k_before']}->{o['k']}" if o.get("k_before") not in (None, o["k"]) else f"k={o['k']}"
    return f"{k} ({n} change{'' if n == 1 else 's'})" + (
        f", live k {o['state']}" if o.get("state") not in (None, "on") else ""
    )
