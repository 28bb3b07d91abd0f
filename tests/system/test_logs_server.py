"""The logs of a real `keysvc serve`: a bad log level stops it with one line; it writes
JSON lines without credentials, and every request before it exits."""

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import basic
from tests.logs import KEY
from tests.server import Server, bootstrap, keysvc


def test_unknown_log_level_stops_the_command_with_one_line(tmp_path: Path) -> None:
    done = keysvc("serve", "--db", str(tmp_path / "k.db"), "--log-level", "nonsense")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "keysvc: log-level: 'nonsense' is not a log level;"
        " use one of debug, info, warning, error, critical"
    ]
    assert not (tmp_path / "k.db").exists()


def test_serve_writes_json_lines_without_credentials(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    created = bootstrap(db)
    path = f"/v1/organizations/{created['organizationId']}/keys/{created['id']}"
    good = basic(created["keyId"], created["keySecret"])
    bad = basic(created["keyId"], "not-the-secret")
    with Server(db, env={"KEYSVC_LOG_LEVEL": "debug"}) as server:
        for headers in (good, bad):
            request = urllib.request.Request(server.base + path, headers=headers)
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except urllib.error.HTTPError as exc:
                exc.close()
        server.stop()
        text = server.stderr_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert any(line["level"] == "debug" for line in lines)  # the level was applied
    access = [line for line in lines if line["logger"] == "keysvc.access"]
    # Server() polls /healthz until it answers.
    assert {line["route"] for line in access} == {"/healthz", KEY}
    mine = [line for line in access if line["route"] == KEY]
    assert [(line["status"], line.get("auth")) for line in mine] == [
        (200, "ok"),
        (401, "invalid_credentials"),
    ]
    assert mine[0]["caller"] == {"id": created["id"], "organizationId": created["organizationId"]}
    for secret in (
        created["keyId"],
        created["keySecret"],
        good["Authorization"],
        bad["Authorization"],
    ):
        assert secret not in text
        assert secret.removeprefix("Basic ") not in text


def _verify_many(server: Server, created: dict[str, Any], count: int) -> None:
    headers = basic(created["keyId"], created["keySecret"])
    for _ in range(count):
        request = urllib.request.Request(server.base + "/v1/verify", headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200


@pytest.mark.parametrize("workers", ["1", "2"])
def test_every_request_is_logged_before_the_server_exits(tmp_path: Path, workers: str) -> None:
    """SIGTERM right after the last answer: every access line is in the log, whether
    the writer thread had it queued (one process) or workers wrote it themselves."""
    db = tmp_path / "k.db"
    created = bootstrap(db)
    # Every line: by default a verify's success has none (KEYSVC_ACCESS_LOG).
    env = {"KEYSVC_WORKERS": workers, "KEYSVC_ACCESS_LOG": "all"}
    with Server(db, env=env) as server:
        _verify_many(server, created, 150)
        server.stop()
        assert server.proc.returncode == 0
        text = server.stderr_text()
    lines = [json.loads(line) for line in text.splitlines()]
    verified = [line for line in lines if line.get("route") == "/v1/verify"]
    assert len(verified) == 150
    assert {(line["status"], line["auth"]) for line in verified} == {(200, "ok")}
    assert created["keySecret"] not in text
