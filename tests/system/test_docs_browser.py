"""/docs renders the served OpenAPI document in a real browser, with no internet.

Chromium comes from Debian's packages (tests/components.py).
It loads the page from a real server on loopback and the test reads the DOM
that Swagger UI built: one operation block per documented operation.
"""

import json
import re
import subprocess
import urllib.request
from pathlib import Path

from tests.components import require_command
from tests.server import Server, bootstrap

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
    "--dump-dom",
)


def test_docs_page_renders_every_operation(tmp_path: Path) -> None:
    chromium = require_command("chromium", package="chromium")
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db) as server:
        with urllib.request.urlopen(server.base + "/v1/openapi.json") as response:
            document = json.load(response)
        done = subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", server.base + "/docs"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        server.stop()
    dom = done.stdout
    assert "OAS 3.1" in dom, done.stderr[-2000:]
    rendered = re.findall(r'opblock-summary-path" data-path="([^"]+)"', dom)
    expected = [path for path, ops in document["paths"].items() for _ in ops]
    # Swagger UI renders each of the document's webhooks (the deliveries keysvc sends)
    # as an operation too, under the webhook's name.
    expected += [name for name, ops in document.get("webhooks", {}).items() for _ in ops]
    assert document.get("webhooks"), "the document names the deliveries it sends"
    assert sorted(rendered) == sorted(expected)
