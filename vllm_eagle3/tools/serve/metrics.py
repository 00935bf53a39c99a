"""What a running server reports on ``/metrics``: vLLM's speculative-decoding counters.

Data flow position: outside the engine, after it. vLLM's EAGLE-3 proposer drafts, the target verifies, and the
engine counts drafts, drafted tokens and accepted tokens per position as Prometheus counters
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``,
``..._num_accepted_tokens_per_pos_total``). :class:`SpecDecodeCounters` reads them (parsed by
``prometheus_client``, a vLLM dependency); subtract two snapshots to measure one workload.
"""

from __future__ import annotations

import dataclasses

from vllm_eagle3.tools.serve.process import http_get

METRIC_DRAFTS = "vllm:spec_decode_num_drafts_total"
METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
METRIC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
METRIC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> ``{sample name: [(labels, value), ...]}`` (``prometheus_client``'s parser;
    counters keep their ``_total`` sample name)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


@dataclasses.dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's cumulative speculative-decoding counters (summed over engines), or the difference of two snapshots.

    One *draft* = one proposal of up to ``num_speculative_tokens`` tokens for one request at one step.
    ``accepted_per_pos[i]`` counts drafts whose token at position i was accepted (so it is non-increasing in i).
    """

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]

    @classmethod
    def from_metrics(cls, text: str) -> "SpecDecodeCounters":
        """Parse a ``/metrics`` body. Raises ``LookupError`` when the server has no spec-decode counters."""
        samples = parse_prometheus(text)
        if METRIC_DRAFTS not in samples:
            raise LookupError(
                f"{METRIC_DRAFTS} is not in /metrics: was the server started with a --speculative-config?"
            )

        def total(name: str) -> float:
            return sum(v for _, v in samples.get(name, []))

        per_pos: dict[int, float] = {}
        for labels, value in samples.get(METRIC_ACCEPTED_PER_POS, []):
            pos = int(labels.get("position", "0"))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        ordered = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
        return cls(total(METRIC_DRAFTS), total(METRIC_DRAFT_TOKENS), total(METRIC_ACCEPTED), ordered)

    @classmethod
    def fetch(cls, base_url: str) -> "SpecDecodeCounters":
        status, body = http_get(base_url.rstrip("/") + "/metrics")
        if status != 200:
            raise LookupError(f"GET {base_url}/metrics answered {status}")
        return cls.from_metrics(body)

    def __sub__(self, earlier: "SpecDecodeCounters") -> "SpecDecodeCounters":
        n = max(len(self.accepted_per_pos), len(earlier.accepted_per_pos))
        a = self.accepted_per_pos + (0.0,) * (n - len(self.accepted_per_pos))
        b = earlier.accepted_per_pos + (0.0,) * (n - len(earlier.accepted_per_pos))
        return SpecDecodeCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            tuple(x - y for x, y in zip(a, b)),
        )

    @property
    def acceptance_length(self) -> float:
        """Mean tokens emitted per target verification step: 1 (the target's own token) + accepted per draft."""
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / proposed draft tokens."""
        return self.accepted / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def per_position(self) -> tuple[float, ...]:
        """Fraction of drafts whose token at position i was accepted (position 0 = first drafted token)."""
        return tuple(x / self.drafts if self.drafts else float("nan") for x in self.accepted_per_pos)

    def summary(self) -> str:
        pos = ", ".join(f"{p:.3f}" for p in self.per_position)
        return (
            f"acceptance length {self.acceptance_length:.3f} (1 + {self.accepted:.0f} accepted / "
            f"{self.drafts:.0f} drafts); draft-token acceptance {self.acceptance_rate:.3f}; "
            f"per position [{pos}]"
        )
