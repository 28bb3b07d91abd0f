"""The API reference (docs/api.md) from keysvc's own OpenAPI document, at build time.

The document is ``keysvc.http.openapi.buildbuild_spec()``, the one ``/v1/openapi.json``
serves, so the reference is always the running code's. The page gets a table of
every operation (indexed by the site's search, readable without JavaScript) and
Swagger UI for the schemas. Swagger UI's assets come from swagger-ui-py, the package
keysvc itself serves its /docs page from: the same pinned files, nothing fetched at
build or view time. The document goes in as a script (``openapi.js``) rather than
fetched as JSON, so the page works opened from the disk (file://) too.
"""

from __future__ import annotations

import json
from importlib import util
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from keysvc.http.openapi import build_spec

PAGE = "api.md"
MARKER = "<!-- openapi-reference -->"
FOLDER = "api"
ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js")
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# The page's script: Swagger UI on the document, no validator badge (it would call
# out to the validator's site), no "Try it out" (there is no server behind the site).
INIT = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    spec: window.keysvcOpenApi,
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    supportedSubmitMethods: [],
  });
});
"""


def _swagger_static() -> Path:
    spec = util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed: make install")
    return Path(spec.submodule_search_locations[0]) / "static"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    spec = build_spec()
    static = _swagger_static()
    for name in ASSETS:
        files.append(File.generated(config, f"{FOLDER}/{name}", abs_src_path=str(static / name)))
    files.append(
        File.generated(config, f"{FOLDER}/openapi.json", content=json.dumps(spec, indent=1))
    )
    script = f"window.keysvcOpenApi = {json.dumps(spec)};\n{INIT}"
    files.append(File.generated(config, f"{FOLDER}/openapi.js", content=script))
    return files


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def operations_table(spec: dict[str, Any]) -> str:
    """Every operation as a Markdown table row (method, path, summary, operationId);
    then the webhooks keysvc sends, by name."""
    rows = ["| Method | Path | What it does | operationId |", "| --- | --- | --- | --- |"]
    for part, shown in (("paths", "`{}`"), ("webhooks", "webhook {}")):
        for path, item in spec.get(part, {}).items():
            for method in METHODS:
                operation = item.get(method)
                if operation is None:
                    continue
                summary = operation.get("summary") or operation.get("description", "")
                rows.append(
                    f"| {method.upper()} | {shown.format(_cell(path))} "
                    f"| {_cell(summary.split(chr(10) * 2)[0])} "
                    f"| `{operation['operationId']}` |"
                )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} line")
    spec = build_spec()
    block = "\n".join(
        [
            f"keysvc {spec['info']['version']}, OpenAPI {spec['openapi']}: "
            f"[the document itself]({FOLDER}/openapi.json).",
            "",
            operations_table(spec),
            "",
            f'<link rel="stylesheet" href="{FOLDER}/swagger-ui.css">',
            '<div id="swagger-ui"></div>',
            f'<script src="{FOLDER}/swagger-ui-bundle.js"></script>',
            f'<script src="{FOLDER}/openapi.js"></script>',
        ]
    )
    return markdown.replace(MARKER, block)
