"""``keysvc audit verify --db postgresql://...``: the activity chains and the replay
checked on PostgreSQL as on SQLite's file, with the same exit codes and messages: 0
when intact (also while an instance writes, in one snapshot), 1 naming what was
edited by hand, 2 when it cannot check (no pepper, the wrong one)."""

import json
import threading
from collections.abc import Iterator

import pytest

from tests.postgres import PEPPER, Postgres
from tests.server import Server, call, keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex()}


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    return postgres.url(pg_database)


@pytest.fixture
def written(url: str) -> Iterator[tuple[Server, dict[str, str]]]:
    """A served database with a custom role and keys made, renamed and deleted."""
    done = keysvc("bootstrap", "--db", url, env=ENV)
    assert done.returncode == 0, done.stderr
    admin: dict[str, str] = json.loads(done.stdout)
    keys = f"/v1/organizations/{admin['organizationId']}/keys"
    with Server(url, env=ENV) as server:  # type: ignore[arg-type]
        roles = keys.replace("/keys", "/roles")
        assert (
            call(server.base, roles, admin, "POST", {"name": "r", "permissions": ["keys:read"]})[0]
            == 200
        )
        for n in range(3):
            status, made = call(
                server.base, keys, admin, "POST", {"name": f"k{n}", "roles": ["developer"]}
            )
            assert status == 200, made
        key_id = made["result"]["key"]["id"]
        assert call(server.base, f"{keys}/{key_id}", admin, "PATCH", {"name": "renamed"})[0] == 200
        assert call(server.base, f"{keys}/{key_id}", admin, "DELETE")[0] == 200
        yield server, admin


def verify(url: str, pepper: str = PEPPER.hex()) -> tuple[int, str, str]:
    done = keysvc("audit", "verify", "--db", url, env={"KEYSVC_PEPPER": pepper})
    return done.returncode, done.stdout, done.stderr


def test_an_intact_log_verifies(written: tuple[Server, dict[str, str]], url: str) -> None:
    assert verify(url) == (0, "audit log intact: 7 activities in 1 organizations\n", "")


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        (
            'update activities set after = \'{"name": "tampered"}\''
            " where seq = (select max(seq) from activities where type = 'key_create')",
            "its content does not match its hash: it was edited",
        ),
        (
            "delete from activities where seq = (select max(seq) from activities)",
            "the last records were removed",
        ),
        (
            "update api_keys set name = 'tampered' where seq = (select max(seq) from api_keys)",
            "name differs from its last recorded value",
        ),
    ],
)
def test_an_edit_by_hand_is_named(
    written: tuple[Server, dict[str, str]],
    url: str,
    postgres: Postgres,
    pg_database: str,
    statement: str,
    says: str,
) -> None:
    postgres.psql(pg_database, statement)
    status, out, err = verify(url)
    assert (status, out) == (1, "")
    assert err.startswith("keysvc: audit verify: ") and says in err, err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("pepper", "says"),
    [
        ("f" * 64, "the pepper does not match this database"),
        ("", "a PostgreSQL database needs KEYSVC_PEPPER"),
    ],
)
def test_without_its_pepper_it_cannot_check(
    written: tuple[Server, dict[str, str]], url: str, pepper: str, says: str
) -> None:
    status, out, err = verify(url, pepper)
    assert (status, out) == (2, "")
    assert says in err and len(err.splitlines()) == 1, err


def test_it_verifies_while_an_instance_writes(
    written: tuple[Server, dict[str, str]], url: str
) -> None:
    """Heads and records come from one snapshot: a write committed between the two
    reads would otherwise make an intact chain look cut short."""
    server, admin = written
    keys = f"/v1/organizations/{admin['organizationId']}/keys"
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            call(server.base, keys, admin, "POST", {"name": f"w{n}", "roles": ["developer"]})

    writer = threading.Thread(target=write)
    writer.start()
    try:
        verdicts = [verify(url) for _ in range(5)]
    finally:
        stop.set()
        writer.join(timeout=30)
    assert [(status, err) for status, _, err in verdicts] == [(0, "")] * 5
