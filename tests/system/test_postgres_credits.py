"""Issue 29: credits spent exactly across two `keysvc serve` instances on one PostgreSQL
database, verifies spread over both (the instances are tests/pginstances.py's)."""

from tests import pginstances
from tests.credits import assert_exact, metered_key, remaining, run
from tests.pginstances import Client

admin = pginstances.admin
two = pginstances.two


def test_200_verifies_on_two_instances_grant_exactly_50(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = (client.server.base for client in two)
    key_id, creds = metered_key(a, admin, 50)
    answers = run([a, b], [creds], [1] * 200)
    assert [x.status for x in answers].count(200) == 50
    assert [x.status for x in answers].count(429) == 150
    assert_exact(answers, 50, remaining(b, admin, key_id))


def test_costs_1_to_5_on_two_instances(two: tuple[Client, Client], admin: dict[str, str]) -> None:
    a, b = (client.server.base for client in two)
    key_id, creds = metered_key(b, admin, 50)
    answers = run([a, b], [creds], [1 + n % 5 for n in range(200)])
    assert_exact(answers, 50, remaining(a, admin, key_id))
