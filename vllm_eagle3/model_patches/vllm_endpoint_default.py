"""vLLM: this project's read-only ``GET /v1/eagle3/wiring`` route loads on plain ``vllm serve`` with ``VLLM_PLUGINS``
unset.

Why: vLLM 0.32-0.34 load a ``vllm.endpoint_plugins`` entry point only when ``VLLM_PLUGINS`` names it
(``vllm/plugins/__init__.py`` ``load_endpoint_plugins``: with the variable unset it returns ``[]`` and logs
"Found endpoint plugin(s) [...] but VLLM_PLUGINS is not set" at every start). So plain ``vllm serve`` with the plugin
installed answered 404 on the wiring watch's route, and setting ``VLLM_PLUGINS`` to reach it turns
every other plugin group into an allowlist too. The route only reads the watch's verdict in-process
(:class:`vllm_eagle3.watch_vllm.WiringEndpoint`): it sends nothing to the engine and changes nothing.

The patch wraps ``vllm.plugins.load_endpoint_plugins`` (``attach_endpoint_plugins`` imports it from ``vllm.plugins``
at call time, while ``build_app`` runs; the general plugin has run by then, from vLLM's argument parser). With
``VLLM_PLUGINS`` unset it returns this project's installed endpoint (``vllm_eagle3_wiring``, ``required_tasks``
None) and nothing else; any OTHER endpoint plugin keeps vLLM's rule: not loaded, and vLLM's warning names it (and
only it). With ``VLLM_PLUGINS`` set, vLLM's function runs unchanged: an allowlist without ``vllm_eagle3_wiring`` gets
no route. Applied in every vLLM process; only the API server builds an app.

Guarded by tests/unit/test_endpoint_default.py (vLLM's real ``attach_endpoint_plugins`` on a FastAPI app) and
tests/e2e/test_plain_vllm_serve.py (plain ``vllm serve``: the route answers 200, no "Found endpoint plugin(s)" line).

Retire when: vLLM lets a package declare a read-only endpoint plugin that loads by default (upstream issue to file:
"endpoint plugins: a default-on opt for read-only routes, or VLLM_ENDPOINT_PLUGINS separate from VLLM_PLUGINS").
"""

from __future__ import annotations

from vllm_eagle3.compat import SUPPORTED_VLLM
from vllm_eagle3.model_patches import Patch
from vllm_eagle3.watch import ENDPOINT_PLUGIN as OURS  # the entry point's name in pyproject.toml

_MARK = "_vllm_eagle3_endpoint_default"
_stock = None


def stock_load_endpoint_plugins():
    """vLLM's own ``load_endpoint_plugins``, whether or not this process applied the patch (tests)."""
    import vllm.plugins

    return _stock or vllm.plugins.load_endpoint_plugins


def ours_by_default() -> list:
    """The endpoint plugins to attach with ``VLLM_PLUGINS`` unset: this project's, instantiated, and no other."""
    from importlib.metadata import entry_points

    import vllm.plugins

    discovered = entry_points(group=vllm.plugins.ENDPOINT_PLUGINS_GROUP)
    others = [ep.name for ep in discovered if ep.name != OURS]
    if others:  # vLLM's own words, for the plugins it still leaves out
        vllm.plugins.logger.warning(
            "Found endpoint plugin(s) %s but VLLM_PLUGINS is not set. Endpoint plugins add HTTP routes and must be "
            "explicitly allowlisted via VLLM_PLUGINS to be loaded.",
            others,
        )
    loaded = []
    for ep in discovered:
        if ep.name != OURS:
            continue
        try:
            loaded.append(ep.load()())
        except Exception:  # noqa: BLE001 - as vLLM does for a broken endpoint plugin: say so, serve without the route
            vllm.plugins.logger.exception(
                "Failed to load endpoint plugin %s (vllm-eagle3's GET /v1/eagle3/wiring); the server runs without "
                "that route: reinstall vllm-eagle3, or set EAGLE3_SKIP_PATCHES=vllm_endpoint_default",
                OURS,
            )
    return loaded


def _apply() -> str:
    import vllm.envs
    import vllm.plugins

    global _stock
    original = getattr(vllm.plugins, "load_endpoint_plugins", None)
    if original is None:
        raise RuntimeError(
            "vllm.plugins.load_endpoint_plugins is gone: check how this vLLM loads endpoint plugins "
            "and update or retire vllm_eagle3/model_patches/vllm_endpoint_default.py"
        )
    if getattr(original, _MARK, False):
        return "already patched"
    _stock = original

    def load_endpoint_plugins(supported_tasks=None):
        if vllm.envs.VLLM_PLUGINS is not None:  # an operator's allowlist: vLLM's rule, unchanged
            return original(supported_tasks)
        return ours_by_default()

    load_endpoint_plugins.__doc__ = original.__doc__
    setattr(load_endpoint_plugins, _MARK, True)
    vllm.plugins.load_endpoint_plugins = load_endpoint_plugins
    return f"endpoint plugins: with VLLM_PLUGINS unset, {OURS} (GET /v1/eagle3/wiring, read-only) loads"


PATCH = Patch(
    name="vllm_endpoint_default",
    engine="vllm",
    supported=SUPPORTED_VLLM,  # 0.33/0.34: same load_endpoint_plugins(supported_tasks) (make compat)
    retire_when="vLLM loading a declared read-only endpoint plugin by default (upstream issue to file: "
    "'endpoint plugins: a default-on opt for read-only routes')",
    apply_fn=_apply,
)
