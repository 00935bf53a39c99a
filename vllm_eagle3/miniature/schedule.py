"""Learning-rate schedule of both miniature trainers (train_target.py and train_draft.py).

Where it sits: called once per optimizer step by the training loops. The GPU lease is timed, so a run's
progress is the larger of steps / ``--max-steps`` and seconds / ``--time-budget-s``. Two shapes:

* ``cosine`` (default): linear warm-up, then cosine from ``lr`` to ``min_ratio * lr`` over the whole run;
* ``wsd`` (warm-up, stable, decay): linear warm-up, constant ``lr``, then a linear decay to ``min_ratio * lr``
  over the run's last ``decay_fraction``. With ``decay_fraction`` 0 the run ends at full lr, so a later run can
  resume it (``--resume``) as if it had never stopped: a target trained over several GPU calls.
"""

from __future__ import annotations

import math


def run_progress(step: int, elapsed_s: float, max_steps: int, time_budget_s: float) -> float:
    """Fraction of a training run done: the larger of steps / ``--max-steps`` and seconds / ``--time-budget-s``
    (either may be 0 = not limiting). The run ends at 1.0."""
    return max(step / max_steps if max_steps else 0.0, elapsed_s / time_budget_s if time_budget_s else 0.0)


def progress_text(progress: float, elapsed_s: float) -> str:
    """``"42%, ~3m10s left"``: the run's share done and the time left at the pace so far (the log lines of both
    trainers carry it, so a run of minutes or hours says where it is)."""
    p = min(1.0, max(0.0, progress))
    if p <= 0:
        return "0%, time left unknown"
    left = int(round(elapsed_s * (1 - p) / p))
    return (
        f"{100 * p:.0f}%, ~{left // 3600}h{left % 3600 // 60:02d}m left"
        if left >= 3600
        else f"{100 * p:.0f}%, ~{left // 60}m{left % 60:02d}s left"
    )


def set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def lr_at(
    progress: float,
    step: int,
    lr: float,
    warmup: int,
    min_ratio: float = 0.1,
    schedule: str = "cosine",
    decay_fraction: float = 0.2,
) -> float:
    """Learning rate at ``step`` (global, counts resumed steps) and run ``progress`` in [0, 1].

    Linear warm-up for ``warmup`` steps; then ``cosine``: cosine from ``lr`` to ``min_ratio * lr`` as progress
    -> 1; ``wsd``: ``lr`` until progress reaches ``1 - decay_fraction``, then linear to ``min_ratio * lr``.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(1.0, max(0.0, progress))
    if schedule == "cosine":
        return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
    if schedule != "wsd":
        raise ValueError(f"schedule={schedule!r}; use 'cosine' or 'wsd'")
    if decay_fraction <= 0 or p < 1 - decay_fraction:
        return lr
    return lr * (1 - (1 - min_ratio) * (p - (1 - decay_fraction)) / decay_fraction)
