"""Which requests the online wiring check follows, and what it records of them: the confirmed positions' tokens and
the target's taps there.

Data flow position: inside the engine, after the target forward and sampling, before the proposer (the hook in
:mod:`vllm_eagle3.online.engine_hook` hands each step's rows here). No vLLM import: a step is described by
:class:`RowSpan` records, so the bookkeeping is unit-tested on synthetic steps (tests/unit/test_online_check_parts.py).

What a step's rows are. vLLM lays the scheduled tokens of the batch's requests out contiguously. For a request:

- a prefill chunk: its prompt tokens at positions p..p+n-1, all of them confirmed;
- a verify step: the last confirmed token and the k drafts at p..p+k. Only the first ``a + 1`` rows are confirmed
  (a = drafts accepted): rows past them hold rejected drafts, whose hidden states the sequence never had. The number
  of tokens sampled for the request this step is ``a + 1``: that is the count of valid rows.

A trace is therefore the request's confirmed tokens from the first recorded position on, with the taps at each.
A request preempted and recomputed comes back at an earlier position: the trace is cut there and continues (same
tokens, same states). A gap (positions skipped) ends the trace: it could not be scored as the server ran it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import torch


@dataclasses.dataclass(frozen=True)
class RowSpan:
    """One request's rows in one step."""

    req_id: str
    first_row: int  # index into the step's flattened tokens
    valid: int  # confirmed rows, from first_row on
    position: int  # position of first_row
    prompt_len: int
    temperature: float
    done_after: bool  # the request reaches its token limit with this step's samples


@dataclasses.dataclass
class Trace:
    req_id: str
    prompt_len: int
    start: int  # position of the first recorded row
    tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)  # chunks of token ids [v]
    taps: dict[int, list[torch.Tensor]] = dataclasses.field(default_factory=dict)  # tap -> chunks [v, H]
    length: int = 0

    @property
    def next_position(self) -> int:
        return self.start + self.length

    def append(self, position: int, tokens: torch.Tensor, rows: Mapping[int, torch.Tensor]) -> bool:
        """Add confirmed rows starting at ``position``; False (trace unusable) on a gap."""
        if position > self.next_position:
            return False
        if position < self.next_position:  # recomputed after preemption: cut back, then continue
            if position < self.start:
                return False
            self._truncate(position - self.start)
        self.tokens.append(tokens)
        for k, h in rows.items():
            self.taps.setdefault(k, []).append(h)
        self.length += int(tokens.numel())
        return True

    def _truncate(self, keep: int) -> None:
        toks = torch.cat(self.tokens)[:keep]
        self.tokens = [toks]
        self.taps = {k: [torch.cat(v)[:keep]] for k, v in self.taps.items()}
        self.length = keep

    def materialize(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(token ids [T], {tap: [T, H]}) of the recorded positions start..start+T-1."""
        return torch.cat(self.tokens), {k: torch.cat(v) for k, v in self.taps.items()}

    def num_anchors(self) -> int:
        """Positions i whose label (the token at i + 2) is one the target produced and was recorded."""
        first = max(self.start, self.prompt_len - 2)
        return max(0, self.next_position - 2 - first)


class Tracker:
    """Decides which requests to follow (1 in ``sample_every`` of those at ``temperature <= max_temperature``, while
    the cost budget allows and fewer than ``max_followed`` are followed) and keeps their traces until they end."""

    def __init__(self, sample_every: int, max_temperature: float, max_positions: int, max_followed: int = 4) -> None:
        self.sample_every = sample_every
        self.max_temperature = max_temperature
        self.max_positions = max_positions
        self.max_followed = max_followed
        self.traces: dict[str, Trace] = {}
        self.decided: set[str] = set()  # requests seen (followed or not), until they finish
        self.eligible_seen = 0
        self.followed = 0
        self.too_hot = 0
        self.dropped = 0  # traces ended by a gap
        self.over_budget = 0  # due for following (1 in sample_every) but the cost budget was spent
        self.at_max_followed = 0  # due for following but max_followed were already followed

    def wants(self, span: RowSpan, allow_new: bool) -> bool:
        """Whether this step's rows of ``span.req_id`` should be recorded (decides once per request)."""
        if span.req_id in self.traces:
            return True
        if span.req_id in self.decided:
            return False
        self.decided.add(span.req_id)
        if span.temperature > self.max_temperature:
            self.too_hot += 1
            return False
        self.eligible_seen += 1
        if (self.eligible_seen - 1) % self.sample_every:
            return False
        if not allow_new:
            self.over_budget += 1
            return False
        if len(self.traces) >= self.max_followed:
            self.at_max_followed += 1
            return False
        self.followed += 1
        self.traces[span.req_id] = Trace(span.req_id, span.prompt_len, span.position)
        return True

    def record(self, span: RowSpan, tokens: torch.Tensor, rows: Mapping[int, torch.Tensor]) -> Trace | None:
        """Append ``span``'s valid rows; returns the trace when it is complete (limit reached or full)."""
        trace = self.traces[span.req_id]
        if not trace.append(span.position, tokens, rows):
            del self.traces[span.req_id]
            self.dropped += 1
            return None
        if span.done_after or trace.length >= self.max_positions:
            return self.traces.pop(span.req_id)
        return None

    def finish(self, req_ids: Iterable[str]) -> list[Trace]:
        """Requests vLLM reports finished (or aborted): their traces, to be scored."""
        out = []
        for r in req_ids:
            self.decided.discard(r)
            t = self.traces.pop(r, None)
            if t is not None:
                out.append(t)
        return out
