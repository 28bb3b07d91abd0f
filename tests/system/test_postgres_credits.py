"""Issue 29: credits spent exactly across two `keysvc serve` instances on one PostgreSQL
database, verifies spread over both."""

import json
from collections.abc import Iterator

import pytest

from tests.credits import assert_exact, metered_key, remaining, run
from tests.postgres import PEPPER, Postgres
from tests.server import Server, keysvc

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


def test_200_verifies_on_two_instances_grant_exactly_50(
    two: tuple[Server, Server], admin: dict[str, str]
) -> None:
    a, b = two
    key_id, creds = metered_key(a.base, admin, 50)
    answers = run([a.base, b.base], creds, [1] * 200)
    assert [x.status for x in answers].count(200) == 50
    assert [x.status for x in answers].count(429) == 150
    assert_exact(answers, 50, remaining(b.base, admin, key_id))


def test_costs_1_to_5_on_two_instances(two: tuple[Server, Server], admin: dict[str, str]) -> None:
    a, b = two
    key_id, creds = metered_key(b.base, admin, 50)
    answers = run([a.base, b.base], creds, [1 + n % 5 for n in range(200)])
    assert_exact(answers, 50, remaining(a.base, admin, key_id))
