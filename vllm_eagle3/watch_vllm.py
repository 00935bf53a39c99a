"""vLLM side of the wiring watch: a stat-logger plugin that feeds it, an endpoint plugin that shows it, gauges.

Data flow position: vLLM's scheduler -> ``SchedulerStats.spec_decoding_stats`` (every step, computed anyway for
``/metrics``) -> AsyncLLM's output handler in the API-server process -> :class:`WiringWatchStatLogger.record`
-> :class:`vllm_eagle3.watch.WiringWatch` -> ``GET /v1/eagle3/wiring`` (:class:`WiringEndpoint`, same process) and
``vllm_eagle3_wiring_*`` Prometheus gauges (default registry, served by vLLM's ``/metrics``). The watch is built from
what the API-server process knows: vLLM's config (target, draft, k), the capture spec's ``watch:`` keys and the taps
resolved from the spec of :func:`vllm_eagle3.resolve.spec_source` (``--additional-config``, else ``EAGLE3_SPEC`` /
``EAGLE3_CONVENTION``), as every worker resolves them.

Entry points (pyproject.toml): ``vllm.stat_logger_plugins`` -> ``vllm_eagle3_watch`` (loaded by vLLM's async
engine in the API server whenever ``VLLM_PLUGINS`` is unset or names it) and ``vllm.endpoint_plugins`` ->
``vllm_eagle3_wiring`` (loaded when ``VLLM_PLUGINS`` is unset, by the engine patch
:mod:`vllm_eagle3.model_patches.vllm_endpoint_default`, or names it, by vLLM's rule). Offline ``vllm.LLM`` does not
load stat-logger plugins. This module imports vLLM: only vLLM loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_eagle3 import verdicts
from vllm_eagle3 import watch as _watch
from vllm_eagle3.live_k_vllm import read_report as read_live_k
from vllm_eagle3.wiring_check import read_reports
from vllm_eagle3.resolve import resolve_from_env, spec_source
from vllm_eagle3.spec import CaptureSpecError

ROUTE = "/v1/eagle3/wiring"


# ----------------------------------------------------------------------------------------------- set-up from files


def wiring_info(
    target: Any, draft: str | Path, environ: Mapping[str, str] | None = None, config: Any = None
) -> dict[str, Any]:
    """The taps this process resolves (as the plugin does in every worker), or why they could not be resolved.
    ``config``: vLLM's config (or its additional config), read first as in the workers."""
    info: dict[str, Any] = {
        "resolved_in": "api-server process (each TP/PP rank logs its own "
        "'vllm-eagle3: capturing taps' line at start-up)"
    }
    try:
        src = spec_source(config, environ)
        info.update(
            spec_from=src.label(),
            spec_file=src.spec_file.spec.source if src.spec_file else None,
            convention=src.convention,
        )
        res = resolve_from_env(target, draft, environ=environ, config=config)
    except CaptureSpecError as exc:
        return {**info, "taps": "unresolved", "source": f"not resolved by vllm-eagle3 ({exc})", "error": str(exc)}
    kind = "spec" if src.spec_file else "convention"
    return {
        **info,
        "taps": res.spec.label(),
        "source": f"{kind} {res.spec.source} (from {src.origin})",
        "draft_ids": list(res.draft_ids),
        "draft_convention": res.draft_convention,
        "runner_ids": list(res.runner_ids),
        "log_line": res.log_line(),
    }


def build_watch(
    target: Any,
    draft: str | Path,
    num_spec_tokens: int,
    engine_index: int = 0,
    environ: Mapping[str, str] | None = None,
    target_label: str | None = None,
    config: Any = None,
) -> _watch.WiringWatch | None:
    """A watch for one engine serving ``target`` + EAGLE-3 ``draft``, or None when the spec disables it."""
    cfg = watch_config_from_env(environ, config)
    if not cfg.enabled:
        return None
    doctor = f"vllm-eagle3 doctor --target {target_label or target} --draft {draft}"
    return _watch.WiringWatch(
        cfg,
        _watch.expectation_for(draft, num_spec_tokens, cfg),
        wiring_info(target, draft, environ, config),
        num_spec_tokens,
        doctor,
        engine_index=engine_index,
    )


# ----------------------------------------------------------------------------------------------- gauges


class WiringCollector:
    """Prometheus collector of the ``vllm_eagle3_wiring_*`` gauges, read from the watches when ``/metrics`` is
    scraped: nothing is set per step. Names stay outside ``vllm:`` (vLLM's ``unregister_vllm_metrics`` drops those).
    Registered once per process in the default registry, which vLLM's ``/metrics`` serves with one API server (with
    ``--api-server-count`` > 1 vLLM serves a multiprocess registry and these gauges are not exported)."""

    model_names: dict[int, str] = {}
    _registered = False

    @classmethod
    def ensure_registered(cls) -> None:
        if not cls._registered:
            from prometheus_client import REGISTRY

            REGISTRY.register(cls())
            cls._registered = True

    def describe(self) -> list:
        return []  # no collect() at registration time

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        labels = ["model_name", "engine"]

        def fam(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"vllm_eagle3_wiring_{name}", doc, labels=[*labels, *extra])

        legend = f"({verdicts.levels_help()}; vllm_eagle3.verdicts)"
        verdict = fam("verdict", f"vllm-eagle3 wiring verdict of the engine, every judge together {legend}")
        watch = fam("watch_verdict", f"the wiring watch's verdict: acceptance vs expectation {legend}")
        drafts = fam("window_drafts", "drafts in the wiring watch's sliding window")
        rate = fam(
            "acceptance",
            "served acceptance per draft position over the window (drafts whose first "
            "position+1 tokens were all accepted / drafts)",
            ("position",),
        )
        length = fam("acceptance_length", "served acceptance length over the window (1 + accepted / drafts)")
        expected = fam(
            "expected_position0",
            "position-0 acceptance the draft should reach (its eval.json; NaN when only the floor applies)",
        )
        cut = fam(
            "wrong_threshold",
            f"the watch says {verdicts.WRONG} when the 99.95% upper bound of position-0 acceptance is below this",
        )
        info = fam("info", "resolved taps and their source (value 1)", ("taps", "source"))
        check = fam(
            "check_verdict",
            f"the online wiring check's verdict: served vs candidate wirings {legend}",
            ("served_taps", "best_taps"),
        )
        check_req = fam("check_requests", "requests the online wiring check has scored")
        check_p0 = fam("check_position0", "first-draft acceptance the online check measured", ("wiring", "taps"))
        check_loss = fam(
            "check_loss",
            f"1 - configured / better first-draft acceptance (the x of {verdicts.heading(verdicts.COSTS)} x%)",
        )
        check_cost = fam("check_cost_fraction", "fraction of the engine's time the online check has used")
        said: dict[str, list[str]] = {}  # engine -> each judge's verdict
        for idx, r in read_reports().items():
            lb = [self.model_names.get(int(idx), "") if idx.isdigit() else "", idx]
            said.setdefault(idx, []).append(r.get("verdict", verdicts.OFF))
            check.add_metric([*lb, r["configured"]["taps"], r["best"]["taps"]], verdicts.level(said[idx][-1]))
            check_req.add_metric(lb, r.get("requests", 0))
            for role in ("configured", "best"):
                check_p0.add_metric([*lb, role, r[role]["taps"]], r[role]["position0"])
            check_loss.add_metric(lb, r.get("loss", 0.0))
            check_cost.add_metric(lb, r.get("cost", {}).get("fraction_of_engine_time", 0.0))
        for w in _watch.active_watches():
            lb = [self.model_names.get(w.engine_index, ""), str(w.engine_index)]
            watch.add_metric(lb, verdicts.level(w.verdict))
            said.setdefault(str(w.engine_index), []).append(w.verdict)
            drafts.add_metric(lb, w.window.drafts)
            for i, r in enumerate(w.window.rates()):
                rate.add_metric([*lb, str(i)], r)
            if w.window.drafts:
                length.add_metric(lb, w.window.acceptance_length())
            e = w.expectation
            expected.add_metric(lb, e.position0 if e.position0 is not None else float("nan"))
            cut.add_metric(lb, e.wrong_below)
            info.add_metric([*lb, str(w.wiring.get("taps")), str(w.wiring.get("source"))[:200]], 1)
        for idx, words in said.items():
            lb = [self.model_names.get(int(idx), "") if idx.isdigit() else "", idx]
            verdict.add_metric(lb, verdicts.level(verdicts.overall(words)))
        yield from (
            verdict,
            watch,
            drafts,
            rate,
            length,
            expected,
            cut,
            info,
            check,
            check_req,
            check_p0,
            check_loss,
            check_cost,
        )


# ----------------------------------------------------------------------------------------------- stat logger


def _target_for_resolution(vllm_config: Any) -> str | dict:
    """The target's folder when local (resolve reads its config.json), else its HF config as a dict."""
    model = vllm_config.model_config.model
    if model and (Path(model) / "config.json").is_file():
        return model
    return vllm_config.model_config.hf_config.to_dict()


class WiringWatchStatLogger(StatLoggerBase):
    """A per-engine stat logger: hands each step's spec-decode counts to a :class:`~vllm_eagle3.watch.WiringWatch`.

    Inactive (records nothing) without an EAGLE-3 speculative config or when the spec says ``watch: {enabled:
    false}``.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.watch: _watch.WiringWatch | None = None
        try:
            self._start(vllm_config)
        except Exception:  # noqa: BLE001 - a broken watch must never stop a server; say so once and stand down
            _watch.logger.exception(
                "vllm-eagle3 wiring watch [engine %d]: could not start; serving without it", engine_index
            )
            self.watch = None

    def _start(self, vllm_config: Any) -> None:
        engine_index = self.engine_index
        spec = vllm_config.speculative_config
        if spec is None or getattr(spec, "method", None) != "eagle3" or not getattr(spec, "model", None):
            return
        mc = vllm_config.model_config
        self.watch = build_watch(
            _target_for_resolution(vllm_config),
            spec.model,
            int(spec.num_speculative_tokens),
            engine_index=engine_index,
            target_label=mc.model,
            config=vllm_config,
        )
        if self.watch is None:
            return
        _watch.register_watch(self.watch)
        name = mc.served_model_name
        WiringCollector.model_names[engine_index] = str(
            (name[0] if isinstance(name, (list, tuple)) else name) or mc.model
        )
        WiringCollector.ensure_registered()

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if self.watch is None or scheduler_stats is None:
            return
        sd = scheduler_stats.spec_decoding_stats
        if sd is None or not sd.num_drafts:
            return
        try:
            self.watch.observe(
                sd.num_drafts, sd.num_accepted_tokens_per_pos, getattr(sd, "num_draft_tokens_per_pos", None)
            )
        except Exception:  # noqa: BLE001 - never break vLLM's output loop; stand down after saying why
            _watch.logger.exception("vllm-eagle3 wiring watch [engine %d]: failed; stopped", self.engine_index)
            _watch.unregister_watch(self.watch)
            self.watch = None

    def log_engine_initialized(self) -> None:
        if self.watch is not None:
            e, c = self.watch.expectation, self.watch.cfg
            _watch.logger.info(
                "vllm-eagle3 wiring watch [engine %d]: on; taps %s from %s; expected position-0 acceptance %s (%s); "
                "%s below %.3f, window %d drafts, judged from %d; JSON at %s (VLLM_PLUGINS unset or naming %s)",
                self.engine_index,
                self.watch.wiring.get("taps"),
                self.watch.wiring.get("source"),
                "n/a" if e.position0 is None else f"{e.position0:.3f}",
                e.source,
                verdicts.WRONG,
                e.wrong_below,
                c.window,
                c.min_drafts,
                ROUTE,
                _watch.ENDPOINT_PLUGIN,
            )


# ----------------------------------------------------------------------------------------------- endpoint


class WiringEndpoint:
    """``GET /v1/eagle3/wiring``: :func:`vllm_eagle3.watch.report` as JSON (read in-process, nothing sent to the
    engine)."""

    name = _watch.ENDPOINT_PLUGIN
    required_tasks = None

    def attach_router(self, app: Any) -> None:
        from fastapi import APIRouter
        from fastapi.responses import JSONResponse

        router = APIRouter()

        @router.get(ROUTE)
        async def eagle3_wiring() -> JSONResponse:
            return JSONResponse(_watch.report(read_reports(), read_live_k()))

        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        return None


def watch_config_from_env(environ: Mapping[str, str] | None = None, config: Any = None) -> "_watch.WatchConfig":
    """The ``watch:`` mapping of the capture spec of :func:`vllm_eagle3.resolve.spec_source` (``config``: vLLM's
    config or its additional config, else ``EAGLE3_SPEC``), or the defaults."""
    from vllm_eagle3.watch import WatchConfig, logger

    try:
        return getattr(spec_source(config, environ).spec_file, "watch", None) or WatchConfig()
    except CaptureSpecError as exc:  # the plugin refuses this spec in the workers; say it here too, keep defaults
        logger.warning("vllm-eagle3 wiring watch: %s; using the default watch settings", exc)
        return WatchConfig()
