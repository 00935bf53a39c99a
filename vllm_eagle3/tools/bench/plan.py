"""What one ``vllm-eagle3 bench`` run measures: variants (one server each), their cells, and the named plans. Cell
kinds: ``throughput`` (closed loop, C in flight, ``plan.throughput_requests(C)`` different prompts), ``split`` (the
worker timers around ``max(C, 4)`` requests), ``untimed`` (the same without the timers: their cost), ``stream`` (time
to first token, inter-token latency at concurrency 1).
"""

from __future__ import annotations

import dataclasses

NO_SPEC, EMBED_TAP, NATIVE = "none", "embed", "native"
SGLANG_DEFAULT_WIRING = "sglang_default_wiring"  # advice row of NATIVE: the shipped head fed taps 3/31/59
# The same-taps capture A/B: the SECOND head (trained on taps 3/31/59) served with those taps by the plugin's spec and
# by vLLM's own capture: same head, taps and acceptance, so a difference in the target forward is the capture's.
LAYER_TAPS, NATIVE_LAYERS = "layers", "native-layers"
CAPTURES = (NO_SPEC, EMBED_TAP, NATIVE, LAYER_TAPS, NATIVE_LAYERS)
NATIVE_CAPTURES = (NATIVE, NATIVE_LAYERS)  # served with VLLM_PLUGINS=<patches only>: vLLM's own capture code
AB_PAIRS = ((LAYER_TAPS, NATIVE_LAYERS), (EMBED_TAP, NATIVE))  # (plugin, native) pairs the capture A/B compares
MLA_DEFAULT, MLA_OFF, MLA_ON = "default", "off", "on"
# side-by-side stretches of --plan adaptive (0: one server at a time): choosing k at light load (c <= LIGHT_MAX) and
# loaded (only the k still possible), then judging the table at light load and loaded (JUDGE_REPLICAS servers of
# each speculating configuration at light load: two identical servers on a 2-core VM measured up to 0.83x apart)
CHOOSE_LIGHT, CHOOSE_LOADED, JUDGE, JUDGE_LOADED = 1, 2, 3, 4
STRETCHES = (0, CHOOSE_LIGHT, CHOOSE_LOADED, JUDGE, JUDGE_LOADED)
JUDGING = (JUDGE, JUDGE_LOADED)
LIGHT_MAX = 16
JUDGE_REPLICAS = 2
CELL_KINDS = ("throughput", "untimed", "split", "stream")
_CAPTURE_LABELS = {
    EMBED_TAP: "the capture spec's taps (--capture-spec, plugin capture)",
    NATIVE: "taps 3/31/59 by vLLM's native capture (the incident wiring)",
    LAYER_TAPS: "second head, its taps 3/31/59 by the plugin's capture spec",
    NATIVE_LAYERS: "second head, its taps 3/31/59 by vLLM's native capture",
}
_MLA_LABELS = {
    MLA_DEFAULT: "",
    MLA_OFF: ", MLA verify-as-decode opted out (vLLM's own verify path)",
    MLA_ON: ", MLA verify-as-decode forced on",
}


@dataclasses.dataclass(frozen=True)
class Cell:
    kind: str
    concurrency: int

    def __post_init__(self) -> None:
        if self.kind not in CELL_KINDS:
            raise ValueError(f"cell kind {self.kind!r} is not one of {CELL_KINDS}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.kind == "stream" and self.concurrency != 1:
            raise ValueError("stream cells run at concurrency 1 (they measure a single request's latency)")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One server: ``k`` speculative tokens (0 = none), the capture, the CPU MLA verify path, eager or compiled, the
    online wiring check on (as shipped) or off, a replica number (2 = the same server again: server-to-server
    noise); ``adaptive``: k per batch size, ``schedule`` filled in by the run (``advise.resolve``); ``live``: the
    shipped default, an adaptive server as the base serve config says (its k, table and live_k: ``run.as_shipped``);
    ``stretch``: 0 = alone, n = the n-th side-by-side stretch (servers alive at once, cells in turns)."""

    k: int
    capture: str = EMBED_TAP
    mla_verify: str = MLA_DEFAULT  # default: the installed plugin's; off/on: EAGLE3_CPU_MLA_VERIFY_AS_DECODE=0/1
    compiled: bool = False
    replica: int = 1
    cells: tuple[Cell, ...] = ()
    check: bool = True
    adaptive: bool = False
    schedule: tuple[tuple[int, int, int], ...] = ()  # (first batch size, last, k) ranges
    stretch: int = 0
    live: bool = False

    def __post_init__(self) -> None:
        if (
            self.capture not in CAPTURES
            or self.mla_verify not in (MLA_DEFAULT, MLA_OFF, MLA_ON)
            or self.replica < 1
            or self.stretch not in STRETCHES
            or (self.k == 0) != (self.capture == NO_SPEC)
        ):
            raise ValueError(
                f"capture must be one of {CAPTURES} (k=0 means no speculation: {NO_SPEC!r}), mla_verify "
                f"default, off or on, replica >= 1, stretch must be one of {STRETCHES}; got {self}"
            )
        if (self.adaptive or self.live) and (self.k == 0 or self.capture != EMBED_TAP or not self.adaptive):
            raise ValueError(
                f"adaptive variants (live: adaptive ones) speculate with the capture spec's taps: "
                f"k >= 1 and capture={EMBED_TAP!r} (got k={self.k}, capture={self.capture!r})"
            )
        if self.schedule and (not self.adaptive or max(e[2] for e in self.schedule) > self.k):
            raise ValueError(
                f"a schedule belongs to an adaptive variant and drafts at most its k={self.k}: {self.schedule}"
            )
        if self.stretch and any(c.kind not in ("throughput", "split") for c in self.cells):
            raise ValueError(f"side-by-side servers run throughput and split cells only (got {self.cells})")
        if not self.check and (self.k == 0 or self.capture in NATIVE_CAPTURES):
            raise ValueError(
                f"check=False needs a server with the plugin's capture: the online wiring check runs "
                f"there only (got k={self.k}, capture={self.capture!r})"
            )

    @property
    def config_key(self) -> str:
        """Same for two replicas of one configuration."""
        base = (
            "nospec"
            if self.k == 0
            else f"{self.capture}-live"
            if self.live
            else f"{self.capture}-adaptive"
            if self.adaptive
            else f"{self.capture}-k{self.k}"
        )
        mla = "" if self.mla_verify == MLA_DEFAULT else f"+mla-{self.mla_verify}"
        return base + mla + ("" if self.check else "+check-off") + ("+compiled" if self.compiled else "")

    @property
    def key(self) -> str:
        """Unique in a plan: the configuration, its replica number, its side-by-side stretch (``nospec@3``)."""
        return (
            self.config_key
            + (f"#{self.replica}" if self.replica > 1 else "")
            + (f"@{self.stretch}" if self.stretch else "")
        )

    @property
    def chooses_k(self) -> bool:
        """A server whose throughput may choose k (the advice, the adaptive table): no speculation or the capture
        spec's taps at a fixed k, as shipped (check on, default MLA path), first replica."""
        return (
            self.capture in (NO_SPEC, EMBED_TAP)
            and self.mla_verify == MLA_DEFAULT
            and self.check
            and self.replica == 1
            and not self.adaptive
            and self.stretch not in JUDGING
        )

    @property
    def side_static(self) -> bool:
        """A static-k server of a judging stretch (what the adaptive server is judged against there)."""
        return self.stretch in JUDGING and self.k > 0 and not self.adaptive

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"

    @property
    def label(self) -> str:
        if self.k == 0:
            s = "no speculation"
        elif self.live:
            s = f"EAGLE-3 as shipped: k per batch size measured live, starting from {schedule_text(self.schedule)}"
        elif self.adaptive:
            s = (
                f"EAGLE-3, k per batch size {schedule_text(self.schedule)}"
                if self.schedule
                else f"EAGLE-3, k per batch size (up to {self.k}) from this run's static-k servers"
            )
        else:
            s = f"EAGLE-3 k={self.k}, {_CAPTURE_LABELS[self.capture]}"
        s += _MLA_LABELS[self.mla_verify] + ("" if self.check else ", online wiring check off") + f", {self.mode}"
        s += f" (server #{self.replica})" if self.replica > 1 else ""
        return s + (
            f", run in turns with the other servers of side-by-side stretch {self.stretch}" if self.stretch else ""
        )

    def cell_list(self, kind: str) -> list[int]:
        return [c.concurrency for c in self.cells if c.kind == kind]

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cells"] = [[c.kind, c.concurrency] for c in self.cells]
        d["schedule"] = [list(e) for e in self.schedule]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Variant":
        return cls(
            **{
                **d,
                "cells": tuple(Cell(k, c) for k, c in d["cells"]),
                "schedule": tuple(tuple(int(x) for x in e) for e in d.get("schedule", ())),
            }
        )


def k_at(schedule, batch: int) -> int:
    """The k ``schedule`` drafts at ``batch`` requests per step (vLLM's lookup: gaps and the tail keep the k before)."""
    return next((kk for a, _, kk in reversed(schedule) if a <= batch), schedule[0][2])


def schedule_text(schedule) -> str:
    """``1-2: k=3, 3-8: k=2, 9+: k=0`` (the last range open-ended)."""
    return ", ".join(
        f"{f'{a}+' if i == len(schedule) - 1 else a if a == b else f'{a}-{b}'}: k={k}"
        for i, (a, b, k) in enumerate(schedule)
    )


# Sizing a sustained cell (Plan.steps): tokens per request and step assumed (the shipped k = 5's acceptance length,
# the longest measured on the held-out prompts: a shorter one only lengthens the cell), and a wave more for the tails.
SUSTAINED_TAU = 3
SUSTAINED_MARGIN = 1


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    variants: tuple[Variant, ...]
    prompts: int = 16  # different prompts per throughput cell (the same ones in every variant)
    max_tokens: int = 128  # output tokens per request (ignore_eos, greedy)
    split_tokens: int = 48
    stream_prompts: int = 4
    waves: int = 4  # a throughput cell at concurrency C sends at least waves x C requests (see throughput_requests)
    steps: int = 0  # sustained load: a throughput cell at C lasts at least this many decode steps at batch C

    def __post_init__(self) -> None:
        if self.prompts < 2 or self.max_tokens < 2 or self.waves < 1 or self.steps < 0:
            raise ValueError(
                f"a plan needs prompts >= 2 (an interval needs two), max_tokens >= 2, waves >= 1 and steps >= 0; "
                f"got prompts={self.prompts}, max_tokens={self.max_tokens}, waves={self.waves}, steps={self.steps}"
            )
        keys = [v.key for v in self.variants]
        if len(set(keys)) != len(keys):
            raise ValueError(f"two variants with the same key in the plan: {keys}; give the second replica=2")

    def as_dict(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "variants"},
            "variants": [v.as_dict() for v in self.variants],
        }

    def throughput_requests(self, concurrency: int) -> int:
        """Requests of a throughput cell at ``concurrency``: ``prompts`` (different ones), at least ``waves`` x
        concurrency so that C requests stay in flight for most of the cell, and with ``steps`` the
        :meth:`sustained_waves` x concurrency (past the prompt file's end its prompts are sent again)."""
        return max(self.prompts, self.waves * concurrency, self.sustained_waves() * concurrency)

    def sustained_waves(self) -> int:
        """Waves of C requests that last ``steps`` decode steps: a wave of ``max_tokens`` tokens lasts ``max_tokens
        / SUSTAINED_TAU`` steps (closed loop: C in flight, refilled as they finish), plus
        ``SUSTAINED_MARGIN`` for the tails where fewer than C are left. 0 without ``steps``."""
        return -(-self.steps * SUSTAINED_TAU // self.max_tokens) + SUSTAINED_MARGIN if self.steps else 0

    def steps_at(self, concurrency: int) -> int:
        """Decode steps a throughput cell at ``concurrency`` runs, at ``SUSTAINED_TAU`` tokens per request and step
        (what ``--dry-run`` prints; e.g. plan shipped at C = 32: 64 requests x 128 tokens / 32 / 3 = 85)."""
        return self.throughput_requests(concurrency) * self.max_tokens // (concurrency * SUSTAINED_TAU)

    def split_requests(self, concurrency: int) -> int:
        return max(concurrency, 4)

    def cell_size(self, kind: str, c: int) -> tuple[int, int]:
        """(requests, output tokens per request) of a cell of ``kind`` at concurrency ``c``."""
        if kind in ("split", "untimed"):
            return self.split_requests(c), self.split_tokens
        return (self.throughput_requests(c) if kind == "throughput" else self.stream_prompts), self.max_tokens


def _cells(kind: str, concs) -> tuple[Cell, ...]:
    return tuple(Cell(kind, c) for c in concs)


def headline_plan(
    name: str = "default",
    *,
    concurrencies=(1, 4, 16),
    k: int = 3,
    compiled: bool = True,
    opt_out: bool = True,
    capture_ab: bool = True,
    sglang_default_throughput=(),
    opt_out_throughput=(),
    **sizes,
) -> Plan:
    """The default run: k vs no speculation at each concurrency (eager, and compiled unless ``compiled=False``),
    the MLA opt-out, the SGLang default wiring (the shipped head fed 3/31/59 by vLLM's native capture) and the
    same-taps capture A/B (the second head on its taps 3/31/59: plugin vs native capture, two servers each,
    alternating)."""
    cs = tuple(concurrencies)
    full = _cells("throughput", cs) + _cells("split", cs)
    head = _cells("throughput", cs) + (Cell("untimed", cs[0]),) + _cells("split", cs) + (Cell("stream", 1),)
    vs = [Variant(0, NO_SPEC, cells=head), Variant(k, EMBED_TAP, cells=head)]
    if capture_ab:
        vs.append(
            Variant(
                k,
                NATIVE,
                cells=_cells("throughput", [c for c in sglang_default_throughput if c in cs]) + _cells("split", cs),
            )
        )
    if opt_out:
        vs.append(
            Variant(
                k,
                EMBED_TAP,
                MLA_OFF,
                cells=_cells("throughput", [c for c in opt_out_throughput if c in cs]) + _cells("split", cs),
            )
        )
    if capture_ab:
        vs += [
            Variant(k, cap, replica=r, cells=_cells("split", cs)) for r in (1, 2) for cap in (LAYER_TAPS, NATIVE_LAYERS)
        ]
    if compiled:
        vs += [Variant(0, NO_SPEC, compiled=True, cells=full), Variant(k, EMBED_TAP, compiled=True, cells=full)]
    return Plan(name, tuple(vs), **sizes)


def check_plan(name: str = "check", *, concurrencies=(1, 4, 16), k: int = 3, compiled: bool = False, **sizes) -> Plan:
    """What the online wiring check costs: the shipped configuration with the check on and off, throughput cells
    only (the cost a client sees), two servers of each: on this shared VM a server process's own speed moves
    throughput as much as the check's 2 % budget, so the ratio is set against two identical servers'. Started on,
    off, off, on: a drift of the machine falls on both sides alike (on, off, on, off would put it on one side)."""
    cells = _cells("throughput", concurrencies)
    return Plan(
        name,
        tuple(
            Variant(k, EMBED_TAP, compiled=compiled, replica=r, check=on, cells=cells)
            for r, on in ((1, True), (1, False), (2, False), (2, True))
        ),
        **sizes,
    )


def adaptive_plan(
    name: str = "adaptive",
    *,
    concurrencies=(1, 4, 16, 32, 64),
    ks=(1, 2, 3, 4, 5),
    compiled: bool = False,
    live: bool = False,
    replicas: int = JUDGE_REPLICAS,
    **sizes,
) -> Plan:
    """Speculation that adapts to load, in four side-by-side stretches (``run.run_stretch``; what each runs, and
    why side by side: docs/adaptive-k.md). Split by load for memory: each server's KV cache fits its busiest cell.
    ``live`` (plans ``shipped``, ``sustained``): the judging stretches only, the shipped default (``Variant.live``) vs
    no spec; ``replicas``: servers of each speculating configuration at light load."""
    light = tuple(c for c in concurrencies if c <= LIGHT_MAX)
    loaded = tuple(c for c in concurrencies if c > LIGHT_MAX)
    vs = []
    for stretch, concs in ((CHOOSE_LIGHT, light), (CHOOSE_LOADED, loaded)) if not live else ():
        if concs:  # throughput cells (run in turns) + timed cells (the worker timers: break-even tau per k)
            timed = _cells("throughput", concs) + _cells("split", concs)
            vs += [
                Variant(k, EMBED_TAP if k else NO_SPEC, compiled=compiled, cells=timed, stretch=stretch)
                for k in (0, *ks)
            ]
    for stretch, concs, n in ((JUDGE, light, replicas), (JUDGE_LOADED, loaded, 1)):
        if not concs:
            continue
        cells = _cells("throughput", concs)  # started in this order: a server that would not fit is a replica
        vs.append(Variant(0, NO_SPEC, compiled=compiled, cells=cells, stretch=stretch))
        for r in range(1, n + 1):
            vs.append(
                Variant(
                    max(ks),
                    EMBED_TAP,
                    compiled=compiled,
                    cells=cells,
                    adaptive=True,
                    replica=r,
                    stretch=stretch,
                    live=live,
                )
            )
            vs += [
                Variant(k, EMBED_TAP, compiled=compiled, cells=cells, replica=r, stretch=stretch)
                for k in (ks if not live else ())
            ]
    return Plan(name, tuple(vs), **sizes)


PLAN_ARGS = {  # smoke: every code path in a few minutes, numbers meaningless; the others: their builder's defaults
    # (check, adaptive: eager, what make demo serves; compiling adds ~9 min per server) and Plan's cell sizes, which
    # an interval needs (adaptive: c=64 x 2 waves)
    "smoke": dict(
        concurrencies=(1, 2),
        compiled=False,
        sglang_default_throughput=(2,),
        opt_out_throughput=(1,),
        prompts=4,
        max_tokens=16,
        split_tokens=12,
        stream_prompts=2,
    ),
    "default": {},
    "check": {},
    "adaptive": dict(waves=2),
    "shipped": dict(waves=2, live=True),
    # the shipped default under sustained load (issue 49): one cell per concurrency long enough for live k to move
    # (Plan.steps: room for reaching the best k from a wrong start, within 600 steps in a bucket with live_k's default
    # settings in tests/unit/test_live_k.py's simulation of this project's 2-core noise, and then holding), one
    # server of each
    "sustained": dict(waves=2, live=True, steps=720, replicas=1),
}
BUILDERS = {
    "check": check_plan,
    "adaptive": adaptive_plan,
    "shipped": adaptive_plan,
    "sustained": adaptive_plan,
}  # not built by headline_plan
# plans not run on the shipped head's eval_prompts.json
PLAN_PROMPTS = {name: "bench/heldout_prompts.json" for name in ("adaptive", "shipped", "sustained")}


def build(name: str, **kw) -> Plan:
    """The plan ``name`` from ``kw`` (its :data:`PLAN_ARGS`, changed by the command line)."""
    return BUILDERS.get(name, headline_plan)(name, **kw)


PLANS = {name: (lambda name=name: build(name, **PLAN_ARGS[name])) for name in PLAN_ARGS}


# ------------------------------------------------------------------------------------------------ duration

# Assumed speeds on a quiet 2-core box, only for the estimate printed before a run: plain decode tok/s of the eager
# miniature per concurrency; EAGLE-3 ~1.6x of it (~1.0x with the MLA opt-out, ~0.5x with the SGLang default wiring);
# compiled ~2x of eager. Server start: eager ~55 s, compiled ~540 s with the compile cache cold, ~120 s warm.
_PLAIN_TOK_S = {1: 6.7, 2: 11.0, 4: 19.4, 8: 31.0, 16: 47.5}
START_S = {"eager": 55.0, "compiled-warm": 120.0, "compiled-cold": 540.0}


def estimate_items(plan: Plan, compile_cache_warm: bool = False) -> dict[tuple, float]:
    """Rough seconds of each server start (key ``(variant key,)``) and cell (``(variant key, kind, concurrency)``)
    of ``plan``, from the assumptions above: server starts + tokens / assumed speed."""
    out = {}
    # resolved at run time (advise.resolve): a judging stretch's static k servers about one server's worth of its
    # cells per replica (each concurrency's best k and table k, mostly the same); the loaded stretch about 4 of its ks
    sides = {s: [v for v in plan.variants if v.side_static and v.stretch == s] for s in JUDGING}
    loaded = sum(1 for v in plan.variants if v.stretch == CHOOSE_LOADED and v.k)
    for v in plan.variants:
        share = (
            max(x.replica for x in sides[v.stretch]) / len(sides[v.stretch])
            if v.side_static
            else min(1.0, 3.0 / loaded)
            if v.stretch == CHOOSE_LOADED and v.k
            else 1.0
        )
        out[(v.key,)] = (
            START_S["eager" if not v.compiled else "compiled-warm" if compile_cache_warm else "compiled-cold"] + 10.0
        ) * min(1.0, share * 2)  # + warm-up
        speed = (1.0 if v.k == 0 else 0.5 if v.capture == NATIVE else 1.0 if v.mla_verify == MLA_OFF else 1.6) * (
            2.0 if v.compiled else 1.0
        )  # x plain decode's tok/s at the cell's concurrency
        for x in v.cells:  # streamed: ~20 % slower
            n, tokens = plan.cell_size(x.kind, x.concurrency)
            tok_s = (_PLAIN_TOK_S.get(x.concurrency) or 15.0 * x.concurrency**0.6) * speed
            out[(v.key, x.kind, x.concurrency)] = share * n * tokens * (1.2 if x.kind == "stream" else 1.0) / tok_s
    return out


class Progress:
    """``cell i/N, ~M min left`` during a run: the plan's own estimate (:func:`estimate_items`, compile cache cold) of
    the server starts and cells not run yet; N: the cells run and those still ahead. A variant's start counts as done
    with its first cell."""

    def __init__(self, plan: Plan) -> None:
        self.left, self.done = estimate_items(plan), 0

    def __call__(self, v: Variant, kind: str, concurrency: int) -> str:
        self.done += 1
        for key in ((v.key,), (v.key, kind, concurrency)):
            self.left.pop(key, None)
        cells = self.done + sum(len(k) > 1 for k in self.left)
        return f"cell {self.done}/{cells}, ~{sum(self.left.values()) / 60:.0f} min left"

    def drop(self, v: Variant) -> None:
        """``v`` ran, failed or was left out: what is left of its estimate is no longer ahead."""
        for k in [k for k in self.left if k[0] == v.key]:
            del self.left[k]
