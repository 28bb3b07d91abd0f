"""The OpenAPI document and a docs page that renders it, both without credentials.

The page and its script are keysvc's own; Swagger UI's assets come from the
swagger-ui-py package, so the page works with no internet. Only the files
listed here are served: nothing else of the package's folder is reachable.
"""

from functools import cache
from importlib import resources, util
from pathlib import Path

from aiohttp import web

from keysvc.auth import public
from keysvc.errors import NotFound
from keysvc.state import OPENAPI

routes = web.RouteTableDef()


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
}
# The page only loads what it names; nothing may be loaded from elsewhere.
_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
)


@routes.get("/v1/openapi.json")
@public
async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


@routes.get("/docs")
@public
async def docs_page(request: web.Request) -> web.Response:
    page = _OWN.joinpath("docs.html").read_text()
    return web.Response(
        text=page, content_type="text/html", headers={"Content-Security-Policy": _CSP}
    )


@routes.get("/docs/assets/{name}")
@public
async def docs_asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name == "docs.js":
        return web.Response(
            text=_OWN.joinpath("docs.js").read_text(), content_type="text/javascript"
        )
    if name not in _ASSETS:
        raise NotFound("not found: no such docs asset")
    return web.FileResponse(_swagger_static() / name, headers={"Content-Type": _ASSETS[name]})
