"""Issue 29: credits spent exactly by `keysvc serve --workers 2` on SQLite (several
processes on one file), and no acknowledged set or increment lost to kill -9."""

from pathlib import Path

from tests.credits import assert_exact, assert_kept, metered_key, remaining, run, spend_until_killed
from tests.server import Server, bootstrap, call

WORKERS = {"KEYSVC_WORKERS": "2"}


def test_200_verifies_against_50_credits_grant_exactly_50(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        key_id, creds = metered_key(server.base, admin, 50)
        answers = run([server.base], [creds], [1] * 200)
        assert [a.status for a in answers].count(200) == 50
        assert [a.status for a in answers].count(429) == 150
        assert sorted(a.remaining for a in answers if a.status == 200) == list(range(50))
        assert_exact(answers, 50, remaining(server.base, admin, key_id))


def test_costs_1_to_5_never_grant_more_nor_refuse_while_enough_remain(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        key_id, creds = metered_key(server.base, admin, 50)
        answers = run([server.base], [creds], [1 + n % 5 for n in range(200)])
        after = remaining(server.base, admin, key_id)
        assert_exact(answers, 50, after)
        assert after == 0 or min(a.cost for a in answers if a.status == 429) > after


def test_kill_9_while_spending_loses_no_acknowledged_set_or_increment(tmp_path: Path) -> None:
    """Verifies spend one each while increments are acknowledged one by one; then kill -9
    (tests/credits.py's spend_until_killed). After a restart the credits are at least the
    last acknowledged set, plus every acknowledged increment, minus every spend that
    could have been made (acknowledged, or in flight), and at most that with the
    increment in flight too (assert_kept)."""
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    start = 100
    with Server(db) as server:
        key_id, creds = metered_key(server.base, admin, 0)
        url = f"/v1/organizations/{admin['organizationId']}/keys/{key_id}/credits"
        assert call(server.base, url, admin, "POST", {"set": start})[0] == 200
        tally = spend_until_killed(server, url, admin, [creds])
    with Server(db) as again:
        assert_kept(tally, start, remaining(again.base, admin, key_id))
