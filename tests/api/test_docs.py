"""The root route and the docs bundle: links to start from, gzip when accepted."""

import gzip
import re

import pytest

from keysvc.http.views.assets import accepts_gzip
from tests.helpers import Client, assert_ok


async def test_root_links_to_the_docs_and_the_document(client: Client) -> None:
    result = await assert_ok(await client.get("/"))  # no credentials
    assert result == {"console": "/console", "docs": "/docs", "openapi": "/v1/openapi.json"}
    for link in result.values():
        response = await client.get(link)
        assert response.status == 200, link


async def _text_assets(client: Client) -> list[str]:
    html = await (await client.get("/docs")).text()
    assets = [
        "/" + asset
        for asset in re.findall(r'(?:src|href)="([^"]+)"', html)
        if asset.endswith((".js", ".css"))
    ]
    assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"} <= set(assets)
    return assets


async def _get(client: Client, path: str, accept_encoding: str) -> tuple[dict[str, str], bytes]:
    response = await client.get(
        path, headers={"Accept-Encoding": accept_encoding}, auto_decompress=False
    )
    assert response.status == 200, path
    return dict(response.headers), await response.read()


async def test_docs_bundle_is_gzipped_when_the_client_accepts_it(client: Client) -> None:
    for path in await _text_assets(client):
        plain_headers, plain = await _get(client, path, "identity")
        assert "Content-Encoding" not in plain_headers, path
        assert plain_headers["Vary"] == "Accept-Encoding", path
        headers, body = await _get(client, path, "br;q=1.0, gzip;q=0.8")
        assert headers["Content-Encoding"] == "gzip", path
        assert headers["Vary"] == "Accept-Encoding", path
        assert headers["Content-Type"] == plain_headers["Content-Type"], path
        assert gzip.decompress(body) == plain, path
        assert int(headers["Content-Length"]) == len(body), path
    _, bundle = await _get(client, "/docs/assets/swagger-ui-bundle.js", "gzip")
    _, plain_bundle = await _get(client, "/docs/assets/swagger-ui-bundle.js", "")
    assert len(bundle) < len(plain_bundle) / 2


async def test_docs_bundle_is_plain_when_gzip_is_refused(client: Client) -> None:
    _, plain = await _get(client, "/docs/assets/swagger-ui.css", "identity")
    assert not plain.startswith(b"\x1f\x8b")  # not gzip's magic number
    for accept_encoding in ("", "deflate", "gzip;q=0", "*;q=1, gzip;q=0"):
        headers, body = await _get(client, "/docs/assets/swagger-ui.css", accept_encoding)
        assert "Content-Encoding" not in headers, accept_encoding
        assert headers["Vary"] == "Accept-Encoding"
        assert body == plain


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("gzip", True),
        ("GZip", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("x-gzip", True),
        ("", False),
        ("identity", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("*, gzip;q=0", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_is_read_with_its_weights(value: str, accepted: bool) -> None:
    assert accepts_gzip(value) is accepted
