"""KEYSVC_ACCESS_LOG on a real `keysvc serve`: which answers get an access line.

The same requests under each setting: a verify that succeeds, a verify refused, a
read of a key, and a request to no route; the log says which got a line."""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import basic
from tests.logs import KEY
from tests.server import Server, bootstrap, status_of

VERIFY = "/v1/verify"


def _get(server: Server, path: str, headers: dict[str, str]) -> int:
    return status_of(server.base + path, headers)


def _access_lines(env: dict[str, str], tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    """The access lines of a server under ``env`` after the same requests (those of
    /healthz left out), and the whole log."""
    db = tmp_path / "k.db"
    created = bootstrap(db)
    good = basic(created["keyId"], created["keySecret"])
    bad = basic(created["keyId"], "not-the-secret")
    key = f"/v1/organizations/{created['organizationId']}/keys/{created['id']}"
    with Server(db, env=env) as server:
        assert _get(server, VERIFY, good) == 200
        assert _get(server, VERIFY, good) == 200
        assert _get(server, VERIFY, bad) == 401
        assert _get(server, VERIFY + "?permission=reports:read", good) == 200
        assert _get(server, key, good) == 200
        assert _get(server, "/v1/nowhere", good) == 404
        server.stop()
        assert server.proc.returncode == 0
        text = server.stderr_text()
    lines = [json.loads(line) for line in text.splitlines()]
    access = [line for line in lines if line["logger"] == "keysvc.access"]
    # Server() polls /healthz until it answers: those lines say nothing here.
    return [line for line in access if line["route"] != "/healthz"], text


def _seen(lines: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(line["route"], line["status"]) for line in lines]


def test_all_logs_every_request(tmp_path: Path) -> None:
    lines, _ = _access_lines({"KEYSVC_ACCESS_LOG": "all"}, tmp_path)
    assert _seen(lines) == [
        (VERIFY, 200),
        (VERIFY, 200),
        (VERIFY, 401),
        (VERIFY, 200),
        (KEY, 200),
        ("unmatched", 404),
    ]


@pytest.mark.parametrize("env", [{}, {"KEYSVC_ACCESS_LOG": "errors"}], ids=["default", "errors"])
def test_errors_skips_only_verify_successes(tmp_path: Path, env: dict[str, str]) -> None:
    lines, _ = _access_lines(env, tmp_path)
    assert _seen(lines) == [(VERIFY, 401), (KEY, 200), ("unmatched", 404)]
    assert lines[0]["auth"] == "invalid_credentials"


def test_off_writes_no_access_line(tmp_path: Path) -> None:
    lines, text = _access_lines({"KEYSVC_ACCESS_LOG": "off"}, tmp_path)
    assert lines == []
    # The server still logs as usual otherwise: its start and its stop.
    assert any(json.loads(line)["logger"] == "keysvc" for line in text.splitlines())


def test_the_flag_wins_over_the_variable(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    created = bootstrap(db)
    good = basic(created["keyId"], created["keySecret"])
    env = {"KEYSVC_ACCESS_LOG": "off"}
    with Server(db, env=env, args=["--access-log", "all"]) as server:
        assert _get(server, VERIFY, good) == 200
        server.stop()
        text = server.stderr_text()
    routes = [json.loads(line).get("route") for line in text.splitlines()]
    assert VERIFY in routes
