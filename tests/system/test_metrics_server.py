"""/metrics of a real `keysvc serve`: the token comes from the environment."""

import urllib.error
import urllib.request
from pathlib import Path

from tests.api.metrics import TOKEN
from tests.server import Server
from tests.server import bootstrap as bootstrap_file


def _get(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def test_serve_reads_the_token_from_the_environment(tmp_path: Path) -> None:
    bootstrap_file(tmp_path / "keysvc.db")
    with Server(tmp_path / "keysvc.db", env={"KEYSVC_METRICS_TOKEN": TOKEN}) as server:
        assert _get(server.base + "/metrics", {}) == 401
        assert _get(server.base + "/metrics", {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert _get(server.base + "/healthz", {}) == 200
