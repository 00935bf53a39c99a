"""vllm_eagle3/model_patches/vllm_media_fetch_unreachable.py: an image URL the server cannot reach is a 422 naming the
URL.

Stock vLLM 0.32 returns the connection error unchanged from ``_wrap_media_fetch_error`` after its retries, and the
API server answers 500 (measured through the server: tests/e2e/test_images.py, case "unreachable URL"). Here the
function itself, no engine: a real ``aiohttp.ClientConnectorError`` from a connection to a closed loopback port.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

pytestmark = pytest.mark.unit


def _connect_error() -> Exception:
    """The exception aiohttp raises for a URL whose host refuses the connection (a loopback port nobody holds)."""
    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there

    async def get():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/cat.png"):
                pass

    try:
        asyncio.run(get())
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("the connection to a closed port succeeded")


def test_unreachable_url_is_a_422_naming_the_url():
    import aiohttp
    from vllm.exceptions import VLLMUnprocessableEntityError
    from vllm.multimodal.media import connector

    from vllm_eagle3 import model_patches
    from vllm_eagle3.model_patches import vllm_media_fetch_unreachable as patch

    exc = _connect_error()
    assert isinstance(exc, aiohttp.ClientConnectorError), type(exc)
    url = "http://127.0.0.1/cat.png"
    stock = patch.stock_wrap_media_fetch_error()
    assert stock(url, exc) is exc, "stock vLLM now maps unreachable URLs itself: retire the patch"

    record = model_patches.apply(patch.PATCH, "0.32.0")
    assert "vllm_media_fetch_unreachable" in record and "skipped" not in record, record
    wrapped = connector._wrap_media_fetch_error(url, exc)
    assert isinstance(wrapped, VLLMUnprocessableEntityError), type(wrapped)
    assert url in str(wrapped) and "data:" in str(wrapped), str(wrapped)

    # What vLLM already maps stays its own: an HTTP 404 from the host, and remote 5xx / other errors unchanged.
    req = aiohttp.RequestInfo(aiohttp.client.URL(url), "GET", {}, aiohttp.client.URL(url))  # type: ignore[arg-type]
    not_found = aiohttp.ClientResponseError(req, (), status=404)
    assert "HTTP 404" in str(connector._wrap_media_fetch_error(url, not_found))
    server_error = aiohttp.ClientResponseError(req, (), status=503)
    assert connector._wrap_media_fetch_error(url, server_error) is server_error
    other = KeyError("x")
    assert connector._wrap_media_fetch_error(url, other) is other
