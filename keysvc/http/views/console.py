"""The management console: one page and its files, from the package's
``keysvc/console`` folder, without credentials.

The console is a client of the public API: it signs in with a key ID and secret
and sends them as Basic auth on each call; nothing here reads them. Only the
files listed here are served. Their URL carries a version made from their bytes,
so they can be cached for good and an upgrade is fetched afresh; the page itself
is revalidated on each visit. Its Content-Security-Policy admits this origin's
files only: no inline script or style, nothing fetched from elsewhere.
"""

import hashlib
from functools import cache
from importlib import resources

from aiohttp import hdrs, web

from keysvc.errors import NotFound
from keysvc.http.routes import CONSOLE, CONSOLE_ASSET, serves
from keysvc.http.views.assets import file_response

_FILES = resources.files("keysvc").joinpath("console")
_JS, _CSS = "text/javascript", "text/css"
ASSETS = {
    "console.css": _CSS,
    "app.js": _JS,
    "api.js": _JS,
    "ui.js": _JS,
    "views.js": _JS,
    "keys.js": _JS,
    "keyextras.js": _JS,
    "roles.js": _JS,
    "identities.js": _JS,
    "listpage.js": _JS,
    "activities.js": _JS,
    "usage.js": _JS,
    "credentials.js": _JS,
}
# Where index.html names the assets' folder; the page is served with the current one.
ASSETS_MARK = "{{assets}}"
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_COMMON = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_PAGE_HEADERS = {
    **_COMMON,
    "Content-Security-Policy": CSP,
    # Revalidated on each visit, so a new version's asset URLs are seen at once.
    hdrs.CACHE_CONTROL: "no-cache",
}
_ASSET_HEADERS = {**_COMMON, hdrs.CACHE_CONTROL: "public, max-age=31536000, immutable"}


@cache
def _asset(name: str) -> bytes:
    return _FILES.joinpath(name).read_bytes()


@cache
def assets_version() -> str:
    """A digest of every asset: it changes whenever any of them does."""
    digest = hashlib.sha256()
    for name in sorted(ASSETS):
        digest.update(name.encode() + b"\0" + _asset(name) + b"\0")
    return digest.hexdigest()[:16]


@cache
def _page() -> str:
    # Relative: the page works under a proxy's path prefix too.
    folder = f"console/assets/{assets_version()}"
    return _FILES.joinpath("index.html").read_text().replace(ASSETS_MARK, folder)


@serves(CONSOLE)
async def console_page(request: web.Request) -> web.Response:
    return web.Response(text=_page(), content_type="text/html", headers=_PAGE_HEADERS)


@serves(CONSOLE_ASSET)
async def console_asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise NotFound("not found: no such console file")
    if request.match_info["version"] != assets_version():
        raise NotFound("not found: the console has been upgraded; reload /console")
    return await file_response(request, _asset(name), ASSETS[name], _ASSET_HEADERS)
