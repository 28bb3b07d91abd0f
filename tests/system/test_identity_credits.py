"""Issue 36: an identity's credits spent exactly by all of its keys at once, with
`keysvc serve --workers 2` on SQLite (several processes on one file) and across two
`keysvc serve` instances on one PostgreSQL database (tests/pginstances.py's); and no
acknowledged increment lost, no spend counted twice, across kill -9.

The guarantee checked is the keys' (tests/credits.py, docs/SECURITY.md "Credits"),
for the identity: the granted costs sum to the credits before minus those after, and
every refusal was decided with fewer credits left than its cost."""

from pathlib import Path

from tests import pginstances
from tests.credits import IDENTITY, assert_exact, assert_kept, run, spend_until_killed
from tests.pginstances import Client
from tests.server import Server, bootstrap, call

admin = pginstances.admin
two = pginstances.two

WORKERS = {"KEYSVC_WORKERS": "2"}
KEYS = 4


def _identity_keys(
    base: str, admin: dict[str, str], credits: int
) -> tuple[str, list[dict[str, str]]]:
    """An identity with ``credits`` and KEYS keys of it (no request limit in the way)."""
    org = f"/v1/organizations/{admin['organizationId']}"
    body = {"externalId": "shared", "credits": {"remaining": credits}}
    status, made = call(base, org + "/identities", admin, "POST", body)
    assert status == 200, made
    keys = []
    for n in range(KEYS):
        key = {
            "name": f"k{n}", "roles": ["developer"], "externalId": "shared",
            "rateLimit": {"limit": 1_000_000, "windowSeconds": 1},
        }  # fmt: skip
        status, created = call(base, org + "/keys", admin, "POST", key)
        assert status == 200, created
        assert created["result"]["key"]["identityId"] == made["result"]["id"]
        keys.append(
            {"keyId": created["result"]["keyId"], "keySecret": created["result"]["keySecret"]}
        )
    return made["result"]["id"], keys


def _remaining(base: str, admin: dict[str, str], identity_id: str) -> int:
    path = f"/v1/organizations/{admin['organizationId']}/identities/{identity_id}"
    status, got = call(base, path, admin)
    assert status == 200, got
    left: int = got["result"]["credits"]["remaining"]
    return left


def test_two_workers_grant_an_identitys_50_credits_exactly(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, 50)
        answers = run([server.base], keys, [1] * 200, IDENTITY)
        assert [a.status for a in answers].count(200) == 50
        assert sorted(a.remaining for a in answers if a.status == 200) == list(range(50))
        assert_exact(answers, 50, _remaining(server.base, owner, identity_id))
        costs = run([server.base], keys, [1 + n % 5 for n in range(20)], IDENTITY)
        assert all(a.status == 429 for a in costs)


def test_two_workers_with_costs_1_to_5(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, 50)
        answers = run([server.base], keys, [1 + n % 5 for n in range(200)], IDENTITY)
        assert_exact(answers, 50, _remaining(server.base, owner, identity_id))


def test_two_postgresql_instances_grant_an_identitys_credits_exactly(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = (client.server.base for client in two)
    identity_id, keys = _identity_keys(a, admin, 50)
    answers = run([a, b], keys, [1] * 200, IDENTITY)
    assert [x.status for x in answers].count(200) == 50
    assert_exact(answers, 50, _remaining(b, admin, identity_id))
    # Nothing left: every cost, on either instance, is refused and spends nothing.
    costs = run([b, a], keys, [1 + n % 5 for n in range(40)], IDENTITY)
    assert_exact(costs, 0, _remaining(a, admin, identity_id))


def test_kill_9_while_an_identitys_keys_spend_loses_no_acknowledged_increment(
    tmp_path: Path,
) -> None:
    """The keys' test (tests/system/test_credits_workers.py) on an identity's credits,
    spent by its keys in turn (tests/credits.py's spend_until_killed): after a restart,
    at least the last acknowledged set plus every acknowledged increment minus every
    spend that could have been made, at most that with the increment in flight too and
    only the acknowledged spends taken (assert_kept)."""
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    start = 100
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, start)
        url = f"/v1/organizations/{owner['organizationId']}/identities/{identity_id}/credits"
        tally = spend_until_killed(server, url, owner, keys, IDENTITY)
    with Server(db) as again:
        assert_kept(tally, start, _remaining(again.base, owner, identity_id))
