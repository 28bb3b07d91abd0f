"""/console and its files, as served: no credentials, the strict CSP, no inline script
or style, every file of keysvc/console reachable at the page's version and cached for
good, the page revalidated, text gzipped when accepted, nothing else of the package.
The console at work in a real browser is tests/system/test_console_browser.py."""

import gzip
import re
from importlib import resources

from keysvc.domain.permissions import MANAGEMENT
from keysvc.http.views.console import ASSETS
from tests.helpers import Client, assert_error

CONSOLE_FILES = resources.files("keysvc").joinpath("console")


async def _assets(client: Client) -> list[str]:
    page = await client.get("/console")  # no credentials
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    return ["/" + link for link in re.findall(r'(?:src|href)="([^"]+)"', html)]


async def test_console_page_has_the_strict_policy_and_revalidates(client: Client) -> None:
    page = await client.get("/console")
    csp = page.headers["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    for directive in ("default-src", "script-src", "style-src", "connect-src"):
        assert directives[directive] == "'self'", directive
    assert directives["frame-ancestors"] == "'none'"
    assert page.headers["Cache-Control"] == "no-cache"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    html = await page.text()
    # Every script has a src (the CSP would refuse an inline one), nothing is remote.
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []
    assert " style=" not in html and "<style" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)


async def test_every_console_file_is_served_versioned_and_cached_for_good(
    client: Client,
) -> None:
    linked = await _assets(client)
    assert len(linked) == 2  # the stylesheet and the entry module; it imports the rest
    folder = linked[0].rsplit("/", 1)[0]
    assert re.fullmatch(r"/console/assets/[0-9a-f]{16}", folder)
    on_disk = {item.name for item in CONSOLE_FILES.iterdir() if item.name != "index.html"}
    assert set(ASSETS) == on_disk
    for name, content_type in ASSETS.items():
        response = await client.get(f"{folder}/{name}", headers={"Accept-Encoding": "identity"})
        assert response.status == 200, name
        assert response.headers["Content-Type"] == content_type, name
        assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert await response.read() == CONSOLE_FILES.joinpath(name).read_bytes(), name


async def test_console_files_are_gzipped_when_accepted(client: Client) -> None:
    folder = (await _assets(client))[0].rsplit("/", 1)[0]
    for name in ASSETS:
        response = await client.get(
            f"{folder}/{name}", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert response.headers["Content-Encoding"] == "gzip", name
        assert response.headers["Vary"] == "Accept-Encoding", name
        body = await response.read()
        assert gzip.decompress(body) == CONSOLE_FILES.joinpath(name).read_bytes(), name


async def test_modules_import_only_served_files(client: Client) -> None:
    """A module the page imports but the server does not list would fail in the browser."""
    for name in ASSETS:
        text = CONSOLE_FILES.joinpath(name).read_text()
        for imported in re.findall(r'from "\./([^"]+)"', text):
            assert imported in ASSETS, (name, imported)


async def test_other_versions_and_names_are_not_found(client: Client) -> None:
    folder = (await _assets(client))[0].rsplit("/", 1)[0]
    stale = await client.get("/console/assets/0000000000000000/app.js")
    await assert_error(stale, 404, "not found: the console has been upgraded; reload /console")
    for name in ("index.html", "..%2Fapp.py", "nope.js"):
        await assert_error(
            await client.get(f"{folder}/{name}"), 404, "not found: no such console file"
        )


async def test_the_role_form_offers_every_permission_the_api_asks_for(client: Client) -> None:
    """The role form's boxes are the management API's permissions (keysvc.domain.permissions),
    as served: none missing, none the API does not know."""
    app_js = next(p for p in await _assets(client) if p.endswith("/app.js"))
    served = await client.get(app_js.rsplit("/", 1)[0] + "/roles.js")
    assert served.status == 200
    listed = re.search(r"const MANAGEMENT = \[(.*?)\];", await served.text(), re.S)
    assert listed is not None
    assert re.findall(r'"([a-z:]+)"', listed.group(1)) == list(MANAGEMENT)
