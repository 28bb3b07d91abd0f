"""Two real `keysvc serve` processes on one PostgreSQL database (--db postgresql://...,
tests/postgres.py): what one creates the other reads at once, what one disables the
other refuses from its very next request, and both stop cleanly on SIGTERM."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.postgres import PEPPER, Postgres
from tests.server import Server, call, keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex()}


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    return postgres.url(pg_database)


@pytest.fixture
def admin(url: str) -> dict[str, str]:
    done = keysvc("bootstrap", "--db", url, env=ENV)
    assert done.returncode == 0, done.stderr
    created: dict[str, str] = json.loads(done.stdout)
    return created


@pytest.fixture
def two(url: str) -> Iterator[tuple[Server, Server]]:
    with Server(url, env=ENV) as a, Server(url, env=ENV) as b:  # type: ignore[arg-type]
        yield a, b


def keys_path(admin: dict[str, str]) -> str:
    return f"/v1/organizations/{admin['organizationId']}/keys"


def made_on(server: Server, admin: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A key created through ``server``, and its credentials."""
    body = {"name": "ci", "roles": ["developer"]}
    status, made = call(server.base, keys_path(admin), admin, "POST", body)
    assert status == 200, made
    result = made["result"]
    return result["key"], {"keyId": result["keyId"], "keySecret": result["keySecret"]}


def test_created_on_one_is_read_and_verified_on_the_other(
    two: tuple[Server, Server], admin: dict[str, str]
) -> None:
    a, b = two
    key, new = made_on(a, admin)
    status, read = call(b.base, f"{keys_path(admin)}/{key['id']}", admin)
    assert (status, read["result"]["name"]) == (200, "ci")
    status, whoami = call(b.base, "/v1/whoami", new)
    assert status == 200, whoami


def test_disabled_on_one_is_refused_by_the_other(
    two: tuple[Server, Server], admin: dict[str, str]
) -> None:
    a, b = two
    key, new = made_on(a, admin)
    assert call(b.base, "/v1/whoami", new)[0] == 200  # b holds it in memory now
    path = f"{keys_path(admin)}/{key['id']}"
    status, _ = call(a.base, path, admin, "PATCH", {"state": "disabled"})
    assert status == 200
    # b acknowledged the change before a answered it.
    answer = call(b.base, "/v1/whoami", new)
    assert (answer[0], answer[1]["error"]) == (401, "key is disabled"), answer
    for server in (a, b):
        assert server.stop() < 10
        assert server.proc.returncode == 0, server.stderr_text()


def test_without_a_shared_pepper_postgresql_is_refused(url: str) -> None:
    done = keysvc("bootstrap", "--db", url, env={"KEYSVC_PEPPER": ""})
    assert done.returncode != 0
    assert "a PostgreSQL database needs KEYSVC_PEPPER" in done.stderr


def test_backup_says_what_to_use_instead(url: str) -> None:
    done = keysvc("backup", "/tmp/keysvc-unused.db", "--db", url, env=ENV)
    assert done.returncode != 0
    assert "pg_dump" in done.stderr
