"""k per batch size measured while serving: the scheduler's lookup chooses k from this engine's own step times.

Data flow position: vLLM's scheduler asks ``dynamic_sd_lookup[batch size]`` once per step for the number of tokens
to draft (vLLM 0.32 ``v1/core/sched/scheduler.py``; both the V1 runner and Model Runner V2 draft what it says). With
``live_k`` in the plugin's ``--additional-config`` that lookup is a :class:`LiveK` (:mod:`vllm_eagle3.live_k_vllm`
wraps the scheduler), which answers from measurements of the machine that serves instead of a table measured elsewhere:

- **cost**: each step's time from ``schedule`` to the end of ``update_from_output`` (scheduling, the model's
  execution and the scheduler's bookkeeping, which also grow with the tokens verified), per batch-size
  bucket (half-octaves: 1; 2; 3; 4; 5-6; 7-9; ...; 27-38; 39-53; 54-76: sizes that close cost alike per
  request) and per k, as a moving
  average of seconds per request. A step verifies the drafts of the step before, so only a step whose k equals the
  previous step's is a sample of that k's cost.
- **gain**: tokens a request emits per step at k, ``1 + a_1 + ... + a_k``, where ``a_j`` is the rate at which the
  first j drafts are all accepted, counted over every verified draft (acceptance belongs to the head and the text,
  not to the batch size, so all buckets share it). A position never drafted yet is extrapolated from the last one
  measured (the head's conditional acceptance rate held).
- **choice**: a bucket whose start was measured on this kind of host (``measured_start``: the table of
  ``configs/live_k_start.yaml``) starts *settled* at that k (below). Any other starts at the configured table's k
  and first *sweeps*: every ``settle_every`` steps it
  holds another k for ``hold`` steps, each k of 0..max_k in turn (the least probed first, the nearest first among
  those), until every one has ``min_probes`` probes; then the k whose tokens per second beat the current k's by
  ``margin`` and by two standard errors, the most, takes over and the bucket sweeps again from there. While none
  does, the k that may still win (gain plus two standard errors above the margin) race on, up to ``evidence`` probes
  each; when none is left, the bucket is settled. A table measured on another machine is often wrong by more than
  one k, and the cost curve is flat near its best (a neighbour alone may gain under the margin while k two away gains
  15 %): a sweep finds it in a few hundred steps where walking one k at a time did not move at all. Settled, every
  ``explore_every`` steps it holds a neighbouring k (one below, then one above, alternating) for ``hold`` steps; a
  neighbour takes over by the same rule over its last ``evidence`` probes, and the bucket sweeps again. Each probe
  is a paired measurement: its steps' cost against the current k's steps just before it. Exploration is bounded:
  ``hold / (explore_every + hold)`` of a settled bucket's steps (10 % by default), and a sweep ends after at
  most ``evidence`` probes of each k; pairing and the evidence rule keep a noisy machine from walking k away from the
  best (comparing moving averages did: in a side-by-side benchmark on two busy cores it took batch 1 from k=5 to k=2).
  A sweep is the price of a start that may be wrong: two thirds of its ~180 steps draft another k, on every fresh
  server. A start measured on this host kind is settled from the first step instead (the 10 % bound holds from
  there); a neighbour that wins still moves it, and the bucket then sweeps. In `bench --plan shipped` on the AMD EPYC
  (AVX-512) the c = 32 cell drafted the start's k = 2 in 53 of its 192 steps with the sweep, 130 of 212 without (the
  rest are batches of 8 or fewer as the cell drains, k = 5).
- **graphs**: with CUDA graphs every k it may draft must run the same kind of step, or a probe measures graphs, not
  k. :func:`vllm_eagle3.live_k_vllm.graph_tokens_of` refuses graph modes captured per k; under PIECEWISE graphs
  (keyed by token count) a neighbour is probed only where both k run graphed, or both eager, at every batch size
  of the bucket.

k = 0 still runs the draft's first pass (the head's KV cache must stay in step, docs/adaptive-k.md), so it is a
choice like any other, not "no speculation". Greedy output does not depend on k (float32: verify and decode agree),
so nothing here can change what is generated, only how fast.

Off unless asked: ``--additional-config '{"vllm_eagle3": {"live_k": true}}'`` (the shipped serve configs ask), or a
mapping of :class:`Settings` fields. Every change of a bucket's k is logged at INFO with the rates that decided it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import Any, Callable, ClassVar, Mapping

from pydantic import Field, model_validator

from vllm_eagle3 import LOGGER, settings

logger = logging.getLogger(f"{LOGGER}.live_k")

CONFIG_NAME = "live_k"
"""The key of the plugin's ``--additional-config`` mapping that turns this on."""


class LiveKError(ValueError):
    """A ``live_k`` setting that cannot work; the message says what to change."""


class Settings(settings.Settings):
    """``live_k``'s mapping in the plugin's ``--additional-config`` (each key's meaning in its description)."""

    section: ClassVar[str] = CONFIG_NAME
    error: ClassVar[type[Exception]] = LiveKError

    explore_every: int = Field(72, ge=1, description="steps in a settled bucket between two probes of a neighbouring k")
    settle_every: int = Field(4, ge=1, description="steps between two probes while a bucket sweeps every k")
    hold: int = Field(8, ge=2, description="steps a probe holds its k (the first verifies the previous k's drafts)")
    margin: float = Field(0.03, ge=0, lt=1, description="how much faster (tokens/s) another k must be to take over")
    min_probes: int = Field(3, ge=2, description="probes of a k before it may take over")
    evidence: int = Field(16, ge=2, description="probes of a k remembered (the last ones); >= min_probes")
    smoothing: float = Field(0.2, gt=0, le=1, description="weight of a new sample in a step-cost moving average")
    memory: float = Field(0.995, gt=0, le=1, description="per-step decay of the acceptance counts (~200 steps)")
    host_table: bool = Field(
        True, description="start from the table measured on this host kind (configs/live_k_start.yaml) when listed"
    )

    @model_validator(mode="after")
    def _evidence_holds_min_probes(self) -> "Settings":
        if self.evidence < self.min_probes:
            raise ValueError(
                f"live_k.evidence = {self.evidence} must be >= live_k.min_probes = {self.min_probes}: raise evidence "
                f"or lower min_probes"
            )
        return self

    @classmethod
    def from_config(cls, value: Any) -> "Settings | None":
        """``live_k``'s value -> settings (None: off). true/false, or a mapping of this class's fields."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise LiveKError(f"live_k must be true, false or a mapping of {sorted(cls.model_fields)}, got {value!r}")
        return cls.from_mapping(value)


def bucket_of(batch: int) -> int:
    """Half-octaves centred on the powers of two (1; 2; 3; 4; 5-6; 7-9; 10-13; 14-19; 20-26; 27-38; 39-53; 54-76;
    ...): a server kept at 32 requests that dips to 31 between a finish and the next admission stays in one bucket."""
    return round(2 * math.log2(batch))


@functools.lru_cache(maxsize=None)
def bucket_range(bucket: int) -> tuple[int, int]:
    first = next(b for b in range(1, 1 << 21) if bucket_of(b) >= bucket)
    return first, next(b for b in range(first, 1 << 21) if bucket_of(b + 1) > bucket)


@dataclasses.dataclass
class _Bucket:
    k: int
    cost: dict[int, float] = dataclasses.field(default_factory=dict)  # k -> seconds per request-step (average)
    steps: int = 0  # steps since the last probe ended
    probe_k: int | None = None
    probe_left: int = 0
    next_up: bool = False  # the next probe goes above the current k (alternates)
    settled: bool = False  # False: sweeping every k (since a start not measured here, or the last change)
    window: list[float] = dataclasses.field(default_factory=list)  # the last samples at k, just before a probe
    probed: list[float] = dataclasses.field(default_factory=list)  # this probe's samples
    evidence: dict[int, list[float]] = dataclasses.field(default_factory=dict)  # k -> log(cost at k / cost now)


class LiveK:
    """The scheduler's per-batch-size k, chosen from this engine's measurements (module docstring).

    ``start[b]`` is the k the configured table gives at batch size ``b`` (vLLM's dense lookup, index 0 unused, one
    entry per batch size the engine runs); ``graph_tokens`` the largest decode step (tokens) that replays a CUDA graph
    (None: the engine captures none): a probe never crosses that line, so it compares k, not graph against eager;
    ``held()`` says whether probing must wait (a seeded sampled request is served: its text depends on the k of every
    step), asked only at steps that would probe; ``measured_start``: ``start`` was measured on this host kind, so each
    bucket starts settled instead of sweeping; ``clock`` is injectable for tests. :meth:`__getitem__` is vLLM's
    lookup; :meth:`observe` takes each finished
    step. Not thread-safe: the scheduler calls both from its one thread.
    """

    def __init__(
        self,
        max_k: int,
        start: list[int],
        settings: Settings = Settings(),
        clock: Callable[[], float] = time.monotonic,
        held: Callable[[], bool] = lambda: False,
        graph_tokens: int | None = None,
        measured_start: bool = False,
    ) -> None:
        if max_k < 1:
            raise LiveKError(f"live_k needs num_speculative_tokens >= 1, got {max_k}")
        self.max_k, self.start, self.settings, self.clock, self.held = max_k, list(start), settings, clock, held
        self.graph_tokens, self.measured_start = graph_tokens, measured_start
        self.buckets: dict[int, _Bucket] = {}
        self.drafted = [0.0] * (max_k + 1)  # [j]: drafts of length >= j (decayed counts)
        self.accepted = [0.0] * (max_k + 1)  # [j]: drafts whose first j tokens were all accepted
        self.last_k: int | None = None  # the k of the step before (its drafts are verified by the next step)
        self.decision: tuple[int, int, bool] | None = None  # the last lookup's (batch, k, is a cost sample)
        self.steps_at = [0] * (max_k + 1)  # steps scheduled at each k (what the log and tests read)
        self.changes = 0
        self.broken: str | None = None  # why live k stopped (an exception in here), else None

    # -- vLLM's lookup --------------------------------------------------------------------------------------------

    def __getitem__(self, batch: int) -> int:
        if self.broken is None:
            try:
                return self._choose(batch)
            except Exception as exc:  # never fatal to the engine: the configured table takes over, said once
                self._break(exc)
        return min(self.start[min(batch, len(self.start) - 1)], self.max_k)

    def _break(self, exc: BaseException) -> None:
        self.broken = f"{type(exc).__name__}: {exc}"
        self.decision = None
        logger.error(
            "vllm-eagle3 live k: OFF from now on, the configured table serves instead: %s (please report this)",
            self.broken,
        )

    def _choose(self, batch: int) -> int:
        b = self._bucket(batch)
        k = b.k
        every = self.settings.explore_every if b.settled else self.settings.settle_every
        if (b.probe_k is not None or b.steps >= every) and self.held():
            b.probe_k, b.probe_left, b.probed = None, 0, []  # no probe while held: every step drafts the bucket's k
        elif b.probe_k is not None:
            k = b.probe_k
        elif b.steps >= every:
            k = self._start_probe(b, bucket_of(batch))
        sample = self.last_k == k  # else this step verifies another k's drafts
        if b.probe_k is not None:
            b.probe_left -= 1
            if b.probe_left == 0:
                b.probe_k = None
        else:
            b.steps += 1
        self.decision = (batch, k, sample)
        self.last_k = k
        self.steps_at[k] += 1
        return k

    def _bucket(self, batch: int) -> _Bucket:
        key = bucket_of(batch)
        if key not in self.buckets:
            k = min(self.start[min(batch, len(self.start) - 1)], self.max_k)
            self.buckets[key] = _Bucket(k=k, settled=self.measured_start)
        return self.buckets[key]

    def _start_probe(self, b: _Bucket, key: int) -> int:
        b.steps = 0
        if not b.settled:
            choice = self._sweep_left(b, key)
        else:
            up = [k for k in (b.k + 1,) if k <= self.max_k and self._same_graphs(key, b.k, k)]
            down = [k for k in (b.k - 1,) if k >= 0 and self._same_graphs(key, b.k, k)]
            choice = (up + down) if b.next_up else (down + up)
            b.next_up = not b.next_up
        if not choice:  # every other k would run another kind of step than k at some batch size of the bucket
            b.settled = True
            return b.k
        b.probe_k, b.probe_left = choice[0], self.settings.hold
        return b.probe_k

    def _candidates(self, b: _Bucket, key: int) -> list[int]:
        """Every k a sweep probes: 0..max_k but the bucket's, each running the same kind of step as it."""
        return [k for k in range(self.max_k + 1) if k != b.k and self._same_graphs(key, b.k, k)]

    def _sweep_left(self, b: _Bucket, key: int) -> list[int]:
        """The k a settling bucket still has to probe, the least probed first, then the nearest, then the lower: each
        k until it has ``min_probes`` probes; after that (a race) only a k that may still win, its gain plus two
        standard errors above the margin, until it has ``evidence`` probes. A k two standard errors short of the
        margin drops out, so the probes go where the answer is still open."""
        s = self.settings
        probes = {k: len(b.evidence.get(k, ())) for k in self._candidates(b, key)}
        left = [k for k, n in probes.items() if n < s.min_probes]
        if not left:
            left = [k for k, n in probes.items() if n < s.evidence and self._bound(b, k, +2) > math.log1p(s.margin)]
        return sorted(left, key=lambda k: (probes[k], abs(k - b.k), k))

    def _graphed_up_to(self, key: int, k: int) -> int:
        """The largest batch size of bucket ``key`` whose decode step at ``k`` (batch * (k + 1) tokens) replays a
        graph (lo - 1: none). E.g. graph_tokens 512, bucket 54-76: k = 5 -> 76, k = 7 -> 64, k = 9 -> 53."""
        lo, hi = bucket_range(key)
        hi = min(hi, len(self.start) - 1)
        return min(hi, max(lo - 1, self.graph_tokens // (k + 1)))

    def _same_graphs(self, key: int, k: int, other: int) -> bool:
        """Whether every batch size of bucket ``key`` runs a decode step at ``k`` and at ``other`` alike (both graphed
        or both eager): only then does a probe of ``other`` measure k."""
        return self.graph_tokens is None or self._graphed_up_to(key, k) == self._graphed_up_to(key, other)

    # -- the finished step ----------------------------------------------------------------------------------------

    def observe(self, decision: tuple[int, int, bool] | None, seconds: float, verified: list[tuple[int, int]]) -> None:
        """A finished step: ``decision`` is what its lookup returned (:attr:`decision` then; None: the step made no
        lookup), ``seconds`` its execution time, ``verified`` (drafted, accepted) per request whose drafts it
        verified."""
        if self.broken is None:
            try:
                self._observe(decision, seconds, verified)
            except Exception as exc:
                self._break(exc)

    def _observe(self, decision: tuple[int, int, bool] | None, seconds: float, verified: list[tuple[int, int]]) -> None:
        s = self.settings
        for j in range(1, self.max_k + 1):
            self.drafted[j] *= s.memory
            self.accepted[j] *= s.memory
        for n, a in verified:
            for j in range(1, min(n, self.max_k) + 1):
                self.drafted[j] += 1
                self.accepted[j] += j <= a
        if decision is None:
            return
        batch, k, sample = decision
        b = self._bucket(batch)
        if sample and seconds > 0:
            per_request = seconds / batch
            old = b.cost.get(k)
            b.cost[k] = per_request if old is None else old + s.smoothing * (per_request - old)
            if k == b.k:
                b.window = (b.window + [per_request])[-(s.hold - 1) :]
            else:
                b.probed.append(per_request)
        if b.probe_k is None and k != b.k:  # a probe's last step: decide
            self._decide(batch, b, k)

    def _decide(self, batch: int, b: _Bucket, probed: int) -> None:
        """Each probe is one paired measurement: its steps against the current k's steps just before it (the
        machine's load and the requests' lengths drift less in a dozen steps than between probes). A probed k takes
        over when, over its last probes, the mean gain in tokens/s beats ``margin`` and two standard errors: one
        lucky probe on a noisy machine is not enough. A settling bucket decides once every k has its probes, for the
        k that gains the most; a settled one for the neighbour just probed."""
        here, b.probed = b.probed, []
        if len(here) < 1 or len(b.window) < 1:
            return
        ev = b.evidence.setdefault(probed, [])
        ev.append(math.log(sum(here) / len(here)) - math.log(sum(b.window) / len(b.window)))
        del ev[: -self.settings.evidence]
        if b.settled:
            if self._wins(b, probed):
                self._move(batch, b, probed)
            return
        key = bucket_of(batch)
        if any(len(b.evidence.get(k, ())) < self.settings.min_probes for k in self._candidates(b, key)):
            return
        winners = [k for k in b.evidence if self._wins(b, k)]
        if winners:
            self._move(batch, b, max(winners, key=lambda k: self.gain(b, k)))
        elif not self._sweep_left(b, key):
            b.settled = True
            lo, hi = bucket_range(bucket_of(batch))
            logger.info(
                "vllm-eagle3 live k: batch %d-%d: k %d settled (%s)",
                lo,
                hi,
                b.k,
                ", ".join(f"k {k}: {100 * math.expm1(self.gain(b, k)):+.1f} %" for k in sorted(b.evidence)),
            )

    def _wins(self, b: _Bucket, k: int) -> bool:
        """Whether ``k``'s probes beat the bucket's k by ``margin``, and by two standard errors (:meth:`_bound`)."""
        if len(b.evidence.get(k, ())) < self.settings.min_probes:
            return False
        return self._bound(b, k, 0) > math.log1p(self.settings.margin) and self._bound(b, k, -2) > 0

    def _bound(self, b: _Bucket, k: int, errors: float) -> float:
        """``k``'s gain plus ``errors`` standard errors (log tokens/s; -inf when unknown). The spread of one probe is
        pooled over every k probed in the bucket (the machine's noise, not the k's): three probes of one k can agree
        by chance, and a sweep that tries every k would find such a k by chance too."""
        ev, gain = b.evidence.get(k, []), self.gain(b, k)
        if gain is None:
            return -math.inf
        lists = [x for x in b.evidence.values() if len(x) >= 2]
        dof = sum(map(len, lists)) - len(lists)
        if not dof:
            return gain if errors == 0 else math.copysign(math.inf, errors)
        squares = sum((v - sum(x) / len(x)) ** 2 for x in lists for v in x)
        return gain + errors * math.sqrt(squares / dof / len(ev))

    def _move(self, batch: int, b: _Bucket, k: int) -> None:
        ev, gain = b.evidence[k], self.gain(b, k)
        lo, hi = bucket_range(bucket_of(batch))
        logger.info(
            "vllm-eagle3 live k: batch %d-%d: k %d -> %d (%+.1f %% tokens/s over %d probes: tokens per "
            "step %.2f vs %.2f, step cost %+.1f %%)",
            lo,
            hi,
            b.k,
            k,
            100 * math.expm1(gain),
            len(ev),
            self.tokens_per_step(k),
            self.tokens_per_step(b.k),
            100 * math.expm1(sum(ev) / len(ev)),
        )
        b.k = k
        b.window, b.evidence, b.settled = [], {}, False
        self.changes += 1

    def gain(self, b: _Bucket, k: int) -> float | None:
        """log(tokens/s at ``k`` / tokens/s at the bucket's k) from its probes' paired costs, or None."""
        ev = b.evidence.get(k)
        if not ev:
            return None
        return math.log(self.tokens_per_step(k) / self.tokens_per_step(b.k)) - sum(ev) / len(ev)

    # -- estimates ------------------------------------------------------------------------------------------------

    def all_accepted(self, j: int) -> float:
        """Rate at which a draft's first ``j`` tokens are all accepted (measured, else extrapolated)."""
        known = [self.accepted[i] / self.drafted[i] for i in range(1, j + 1) if self.drafted[i] >= 8]
        if len(known) == j:
            return known[-1]
        if not known:
            return 0.5**j  # nothing verified yet: a cautious prior, replaced by the first drafts
        last = known[-1]
        ratio = last / known[-2] if len(known) >= 2 and known[-2] > 0 else last
        return last * min(ratio, 1.0) ** (j - len(known))

    def tokens_per_step(self, k: int) -> float:
        return 1.0 + sum(self.all_accepted(j) for j in range(1, k + 1))

    def rate(self, b: _Bucket, k: int) -> float:
        cost = b.cost.get(k)
        return self.tokens_per_step(k) / cost if cost else math.nan

    def table(self) -> list[tuple[int, int, int]]:
        """The current choice as vLLM's table rows, one per bucket seen: (first batch size, last, k)."""
        return [(*bucket_range(key), self.buckets[key].k) for key in sorted(self.buckets)]

    def report(self) -> dict[str, Any]:
        """What ``GET /v1/eagle3/wiring`` shows under ``live_k``: the table now, each bucket's tokens/s (its batch's,
        from
        the moving averages of step cost) for each k it has run, the paired gain of each probed k over the bucket's
        k, the steps drafted at each k, acceptance per position."""
        return {
            "state": f"off: {self.broken}" if self.broken else "on",
            "table": [list(row) for row in self.table()],
            "rates": {
                f"{lo}-{hi}": {
                    str(k): round(self.rate(self.buckets[key], k), 2) for k in sorted(self.buckets[key].cost)
                }
                for key in sorted(self.buckets)
                for lo, hi in [bucket_range(key)]
            },
            "gain_pct": {
                f"{lo}-{hi}": {
                    str(k): round(100 * math.expm1(g), 1)
                    for k in sorted(self.buckets[key].evidence)
                    for g in [self.gain(self.buckets[key], k)]
                    if g is not None
                }
                for key in sorted(self.buckets)
                for lo, hi in [bucket_range(key)]
            },
            "settled": [list(bucket_range(key)) for key in sorted(self.buckets) if self.buckets[key].settled],
            "steps_at_k": {str(k): n for k, n in enumerate(self.steps_at) if n},
            "changes": self.changes,
            "all_accepted": [round(self.all_accepted(j), 4) for j in range(1, self.max_k + 1)],
            "settings": self.settings.model_dump(),
        }
