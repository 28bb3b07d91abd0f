"""Two real `keysvc serve` processes on one PostgreSQL database (tests/postgres.py),
bootstrapped, each with a kept-alive client: the fixtures (``admin``, ``two``) and
helpers the tests of changes across instances share (tests/system/test_postgres_*).
A test module takes the fixtures by name: ``admin = pginstances.admin``."""

import http.client
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keysvc.db.postgres.notifications import LISTENER_PREFIX
from tests.helpers import basic
from tests.postgres import PEPPER, Postgres, start_standby, stop_postgres
from tests.server import Server, keysvc

# No rate limit, and room for the refusals the tests count.
ENV = {"KEYSVC_PEPPER": PEPPER.hex(), "KEYSVC_RATE_LIMIT": "off", "KEYSVC_AUTH_FAILURES": "100000"}
# Generous, for a loaded machine.
WAIT_SECONDS = 30.0
SLACK_SECONDS = 5.0


class Client:
    """A kept-alive HTTP connection to one instance."""

    def __init__(self, server: Server):
        self.server = server
        self._conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_SECONDS)

    def request(
        self, method: str, path: str, creds: dict[str, str], body: Any = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {**basic(creds["keyId"], creds["keySecret"]), "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body)
        self._conn.request(method, path, body=data, headers=headers)
        response = self._conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}

    def whoami(self, creds: dict[str, str]) -> int:
        return self.request("GET", "/v1/whoami", creds)[0]

    def close(self) -> None:
        self._conn.close()


@pytest.fixture
def admin(postgres: Postgres, pg_database: str) -> dict[str, str]:
    """The database bootstrapped: its first admin key's credentials."""
    done = keysvc("bootstrap", "--db", postgres.url(pg_database), env=ENV)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture
def two(
    postgres: Postgres, pg_database: str, admin: dict[str, str]
) -> Iterator[tuple[Client, Client]]:
    url = postgres.url(pg_database)
    with Server(url, env=ENV) as a, Server(url, env=ENV) as b:  # type: ignore[arg-type]
        clients = Client(a), Client(b)
        yield clients
        for client in clients:
            client.close()


def org_path(admin: dict[str, str], path: str) -> str:
    return f"/v1/organizations/{admin['organizationId']}{path}"


def made_on(
    client: Client, admin: dict[str, str], body: dict[str, Any]
) -> tuple[str, dict[str, str]]:
    """A key created through ``client``: its UUID and its credentials."""
    status, made = client.request("POST", org_path(admin, "/keys"), admin, body)
    assert status == 200, made
    result = made["result"]
    return result["key"]["id"], {"keyId": result["keyId"], "keySecret": result["keySecret"]}


def changed(client: Client, admin: dict[str, str], method: str, path: str, body: Any) -> None:
    status, answer = client.request(method, org_path(admin, path), admin, body)
    assert status == 200, answer


def made_role(client: Client, admin: dict[str, str], name: str, permission: str) -> str:
    body = {"name": name, "permissions": [permission]}
    status, made = client.request("POST", org_path(admin, "/roles"), admin, body)
    assert status == 200, made
    role: str = made["result"]["id"]
    return role


def cached_on_both(two: tuple[Client, Client], admin: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A key created through the first instance and used on the second (which caches it)."""
    a, b = two
    key, creds = made_on(a, admin, {"name": "cached", "roles": ["developer"]})
    assert b.whoami(creds) == 200
    return key, creds


def timed_change(client: Client, admin: dict[str, str], key: str, state: str) -> float:
    """How long the key's change of state took to be answered."""
    started = time.monotonic()
    changed(client, admin, "PATCH", f"/keys/{key}", {"state": state})
    return time.monotonic() - started


def lines_with(server: Server, text: str) -> list[str]:
    """The log lines holding ``text``, once there is one (written from a queue)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not (found := [line for line in server.stderr_text().splitlines() if text in line]):
        assert time.monotonic() < deadline, f"never logged: {text}"
        time.sleep(0.05)
    return found


def listening(postgres: Postgres, database: str, server: Server, column: str) -> list[str]:
    """``column`` of pg_stat_activity for ``server``'s listening connection (named
    after its pid), once it is there."""
    name = f"{LISTENER_PREFIX}{server.proc.pid}.%"
    sql = f"select {column} from pg_stat_activity where application_name like '{name}'"
    deadline = time.monotonic() + WAIT_SECONDS
    while not (rows := postgres.psql(database, sql)):
        assert time.monotonic() < deadline, "no listening connection"
        time.sleep(0.05)
    return [row[0] for row in rows]


def flipped(
    writer: Client, readers: dict[str, Client], admin: dict[str, str], key: str,
    creds: dict[str, str], rounds: int,
) -> list[tuple[int, str, int]]:  # fmt: skip
    """``rounds`` of enabling then disabling ``key`` through ``writer``, each state
    asked of every reader by name on the very next request: the answers that were
    wrong (enabled and refused, disabled and let in)."""
    path = f"/keys/{key}"
    missed: list[tuple[int, str, int]] = []
    for round_ in range(rounds):
        for state, wanted in (("enabled", True), ("disabled", False)):
            changed(writer, admin, "PATCH", path, {"state": state})
            for name, reader in readers.items():
                if ((status := reader.whoami(creds)) == 200) != wanted:
                    missed.append((round_, f"{state} on {name}", status))
    return missed


@pytest.fixture(scope="module")
def standby(postgres: Postgres) -> Iterator[Postgres]:
    """A hot standby of the session's PostgreSQL (``pg_basebackup``, streaming)."""
    replica = start_standby(postgres)
    yield replica
    stop_postgres(replica)


@pytest.fixture(scope="module")
def replica_database(postgres: Postgres, standby: Postgres) -> Iterator[str]:
    """One database for a module's replica tests, once the standby has it (two
    instances take seconds to start)."""
    name = postgres.fresh_database()
    sql = f"select 1 from pg_database where datname = '{name}'"
    wait_until(lambda: standby.psql("postgres", sql) != [])
    yield name
    postgres.retire(name)


@pytest.fixture(scope="module")
def replica_admin(postgres: Postgres, replica_database: str) -> dict[str, str]:
    done = keysvc("bootstrap", "--db", postgres.url(replica_database), env=ENV)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def wait_until(ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not ready():
        assert time.monotonic() < deadline, "never came"
        time.sleep(0.05)


def metrics_text(server: Server) -> str:
    with urllib.request.urlopen(f"{server.base}/metrics", timeout=WAIT_SECONDS) as response:
        text: str = response.read().decode()
    return text


def metric(server: Server, name: str, target: str | None = None) -> float:
    """One sample of ``/metrics``: the replica's, or ``target``'s reads."""
    label = f'target="{target}"' if target else "replica="
    for line in metrics_text(server).splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {label} in /metrics")


def replica_up(server: Server) -> bool:
    return metric(server, "keysvc_replica_up") == 1


def replica_reads(server: Server) -> float:
    """The reads ``server`` answered on a replica so far."""
    text = metrics_text(server)
    found = re.findall(r'^keysvc_db_reads_total\{target="127\.0\.0\.1:\d+"\} (\S+)$', text, re.M)
    return sum(float(value) for value in found)


def paused(standby: Postgres) -> None:
    standby.psql("postgres", "select pg_wal_replay_pause()")


def resumed(standby: Postgres) -> None:
    standby.psql("postgres", "select pg_wal_replay_resume()")
