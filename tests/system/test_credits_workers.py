"""Issue 29: credits spent exactly by `keysvc serve --workers 2` on SQLite (several
processes on one file), and no acknowledged set or increment lost to kill -9."""

import contextlib
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from tests.credits import assert_exact, metered_key, remaining, run, verify
from tests.server import Server, bootstrap, call

WORKERS = {"KEYSVC_WORKERS": "2"}


def test_200_verifies_against_50_credits_grant_exactly_50(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        key_id, creds = metered_key(server.base, admin, 50)
        answers = run([server.base], creds, [1] * 200)
        assert [a.status for a in answers].count(200) == 50
        assert [a.status for a in answers].count(429) == 150
        assert sorted(a.remaining or 0 for a in answers if a.status == 200) == list(range(50))
        assert_exact(answers, 50, remaining(server.base, admin, key_id))


def test_costs_1_to_5_never_grant_more_nor_refuse_while_enough_remain(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        key_id, creds = metered_key(server.base, admin, 50)
        answers = run([server.base], creds, [1 + n % 5 for n in range(200)])
        after = remaining(server.base, admin, key_id)
        assert_exact(answers, 50, after)
        assert after == 0 or min(a.cost for a in answers if a.status == 429) > after


def test_kill_9_while_spending_loses_no_acknowledged_set_or_increment(tmp_path: Path) -> None:
    """Verifies spend one each while increments of 1,000 are acknowledged one by one;
    then kill -9. After a restart the credits are at least the last acknowledged set,
    plus every acknowledged increment, minus every spend that could have been made
    (acknowledged, or in flight), and at most that with the increment in flight too."""
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    step, start = 1_000, 100
    acknowledged = {"increments": 0, "granted": 0, "sent": 0}
    stop = threading.Event()
    with Server(db) as server:
        key_id, creds = metered_key(server.base, admin, 0)
        url = f"/v1/organizations/{admin['organizationId']}/keys/{key_id}/credits"
        assert call(server.base, url, admin, "POST", {"set": start})[0] == 200
        lock = threading.Lock()

        def spender() -> None:
            while not stop.is_set():
                with lock:
                    acknowledged["sent"] += 1
                try:
                    answer = verify(server.base, creds, 1)
                except OSError:
                    return  # the server is gone
                if answer.status == 200:
                    with lock:
                        acknowledged["granted"] += 1

        threads = [threading.Thread(target=spender) for _ in range(8)]
        for thread in threads:
            thread.start()
        for _ in range(15):
            assert call(server.base, url, admin, "POST", {"increment": step})[0] == 200
            acknowledged["increments"] += 1
        # One more, in flight when the server dies, or not: either is allowed.
        late = threading.Thread(
            target=lambda: _quietly(
                lambda: call(server.base, url, admin, "POST", {"increment": step})
            )
        )
        late.start()
        server.stop(signal.SIGKILL)
        stop.set()
        for thread in [*threads, late]:
            thread.join(timeout=60)
    with Server(db) as again:
        after = remaining(again.base, admin, key_id)
    assert acknowledged["granted"] > 0  # the kill came while verifies were spending
    total = start + step * acknowledged["increments"]
    in_flight = acknowledged["sent"] - acknowledged["granted"]
    assert total - acknowledged["granted"] - in_flight <= after
    assert after <= total + step - acknowledged["granted"]


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(OSError):
        action()
