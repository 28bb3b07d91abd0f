"""keysvc through a real PgBouncer (Debian's ``pgbouncer``) in transaction pooling
mode (tests/postgres.py, ``Bouncer``): ``--db`` names the pooler, and the listening
connection, which needs a session of its own (LISTEN), goes straight to PostgreSQL
(``--pg-listen-url``). Two instances: creates, verifies and disables through the
pooler, many at once, and a disable on one refused by the other from its very next
request, as without the pooler (tests/system/test_postgres_next_request.py)."""

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.pginstances import ENV, Client, flipped, made_on, org_path
from tests.postgres import Bouncer, Postgres, start_pgbouncer
from tests.server import Server, keysvc

ROUNDS = 20
AT_ONCE = 8


@pytest.fixture(scope="module")
def database(postgres: Postgres) -> Iterator[str]:
    """One database for the module's tests (two instances take seconds to start)."""
    name = postgres.fresh_database()
    yield name
    postgres.retire(name)


@pytest.fixture(scope="module")
def bouncer(postgres: Postgres, database: str) -> Iterator[Bouncer]:
    pooler = start_pgbouncer(postgres, database)
    yield pooler
    pooler.stop()


@pytest.fixture(scope="module")
def direct_env(postgres: Postgres, database: str) -> dict[str, str]:
    return {**ENV, "KEYSVC_PG_LISTEN_URL": postgres.url(database)}


@pytest.fixture(scope="module")
def admin(bouncer: Bouncer, direct_env: dict[str, str]) -> dict[str, str]:
    done = keysvc("bootstrap", "--db", bouncer.url, env=direct_env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def two(
    bouncer: Bouncer, direct_env: dict[str, str], admin: dict[str, str]
) -> Iterator[tuple[Client, Client]]:
    url = bouncer.url
    with (
        Server(url, env=direct_env) as a,  # type: ignore[arg-type]
        Server(url, env=direct_env) as b,  # type: ignore[arg-type]
    ):
        clients = Client(a), Client(b)
        yield clients
        for client in clients:
            client.close()


def test_two_instances_through_the_pooler_refuse_a_disabled_key_from_the_next_request(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = two
    key, creds = made_on(a, admin, {"name": "pooled", "roles": ["developer"]})
    missed = flipped(a, {"b": b}, admin, key, creds, ROUNDS)
    assert missed == []


def test_many_requests_at_once_through_the_pooler_all_succeed(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    """Each thread its own connection: the pool's connections share the pooler's few
    server connections, transaction by transaction (no prepared statement kept)."""

    def work(index: int) -> list[int]:
        client = Client(two[index % 2].server)
        try:
            key, creds = made_on(
                client, admin, {"name": f"at once {index}", "roles": ["developer"]}
            )
            statuses = [client.whoami(creds) for _ in range(5)]
            statuses.append(client.request("GET", org_path(admin, f"/keys/{key}"), admin)[0])
            statuses.append(client.request("GET", org_path(admin, "/keys?limit=5"), admin)[0])
            return statuses
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        answers = [status for statuses in pool.map(work, range(AT_ONCE * 2)) for status in statuses]
    assert set(answers) == {200}, answers
    for client in two:
        assert "Traceback" not in client.server.stderr_text()


def test_without_a_direct_listening_url_the_pooler_is_refused_at_start(
    bouncer: Bouncer,
) -> None:
    """Through a pooler, keysvc's session settings are refused: it says so and stops,
    rather than serving with notifications it cannot trust."""
    done = keysvc("bootstrap", "--db", bouncer.url, env=ENV)
    assert done.returncode != 0
    assert "cannot use the PostgreSQL database" in done.stderr
