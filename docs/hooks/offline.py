"""The site loads nothing from elsewhere, at build time or in a reader's browser, and
works opened from the disk (file://) as well as served.

Material would fetch two scripts from a CDN: Mermaid, for the ```` ```mermaid ````
fences, unless a ``mermaid`` script is already on the page; and iframe-worker's shim,
which its offline plugin adds so that search runs from the disk. ``make install`` puts
the pinned release of each from the npm registry, checked against its SHA-512, into
the virtualenv (``docs-vendor/NAME-VERSION.js``); this hook adds both to the site and
puts them on every page in the CDN's place. Fonts are the system's (``theme.font:
false`` in mkdocs.yml). Then every page is checked: a script, stylesheet, image or
frame from another origin fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# Where the Makefile leaves them: the virtualenv running mkdocs.
VENDOR = Path(sys.prefix) / "docs-vendor"
MERMAID = "assets/vendor/mermaid.min.js"
IFRAME_WORKER = "assets/vendor/iframe-worker-shim.js"
VENDORED = {MERMAID: "mermaid", IFRAME_WORKER: "iframe-worker"}
# A tag that makes the browser fetch: src or href to another origin (http:, https: or //).
FETCHED = re.compile(
    r"<(?:script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href|srcset)"
    r"\s*=\s*[\"']?\s*(?:https?:)?//[^\"'\s>]*",
    re.I,
)


def vendored(name: str) -> Path:
    """The one NAME-VERSION.js make install left for ``name``."""
    found = [
        path
        for path in VENDOR.glob(f"{name}-*.js")
        if re.fullmatch(rf"{re.escape(name)}-[\d.]+\.js", path.name)
    ]
    if len(found) != 1:
        raise PluginError(f"no single {name}-VERSION.js in {VENDOR}: make install fetches it")
    return found[0]


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    for name in VENDORED.values():
        vendored(name)
    # Mermaid on every page, before Material looks for it; the shim in the CDN's place
    # (Material's offline plugin adds the CDN's unless one is named already).
    config.extra_javascript.append(MERMAID)
    polyfills = config.extra.get("polyfills", [])
    config.extra["polyfills"] = [p for p in polyfills if "iframe-worker" not in p]
    config.extra["polyfills"].append(IFRAME_WORKER)
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, name in VENDORED.items():
        files.append(File.generated(config, uri, abs_src_path=str(vendored(name))))
    return files


def remote_loads(html: str) -> list[str]:
    """Every tag in ``html`` that would load something from another origin."""
    return FETCHED.findall(html)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    found = remote_loads(output)
    if found:
        raise PluginError(f"{page.file.src_uri} loads from elsewhere: {found}")
    return output
