"""The root, the OpenAPI document and a docs page that renders it, all without
credentials.

``GET /`` names where to start: the console, the docs page and the document. The
page and its script are keysvc's own; Swagger UI's assets come from the
swagger-ui-py package, so the page works with no internet. Only the files listed
here are served: nothing else of the package's folder is reachable. Text assets go
gzipped to a client that accepts gzip (``keysvc.http.views.assets``).
"""

from functools import cache
from importlib import resources, util
from pathlib import Path

from aiohttp import web

from keysvc.errors import NotFound
from keysvc.http.envelope import ok
from keysvc.http.openapi import document_text
from keysvc.http.routes import CONSOLE, DOCS, DOCS_ASSET, OPENAPI_DOCUMENT, ROOT, serves
from keysvc.http.views.assets import file_response


@cache
def _swagger_static() -> Path:
    # Found without importing swagger_ui, whose framework glue keysvc does not use.
    spec = util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed")
    return Path(spec.submodule_search_locations[0]) / "static"


_OWN = resources.files("keysvc").joinpath("static")
_ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "docs.js": "text/javascript",
}
ROOT_LINKS = {"console": CONSOLE.path, "docs": DOCS.path, "openapi": OPENAPI_DOCUMENT.path}
# The page only loads what it names; nothing may be loaded from elsewhere.
_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
)


@serves(ROOT)
async def root(request: web.Request) -> web.Response:
    """Where to start: the console, the docs page and the OpenAPI document."""
    return ok(request, ROOT_LINKS)


@serves(OPENAPI_DOCUMENT)
async def openapi_document(request: web.Request) -> web.Response:
    return web.Response(text=document_text(), content_type="application/json")


@serves(DOCS)
async def docs_page(request: web.Request) -> web.Response:
    page = _OWN.joinpath("docs.html").read_text()
    return web.Response(
        text=page, content_type="text/html", headers={"Content-Security-Policy": _CSP}
    )


@cache
def _asset(name: str) -> bytes:
    if name == "docs.js":
        return _OWN.joinpath(name).read_bytes()
    return (_swagger_static() / name).read_bytes()


@serves(DOCS_ASSET)
async def docs_asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _ASSETS:
        raise NotFound("not found: no such docs asset")
    return await file_response(request, _asset(name), _ASSETS[name])
