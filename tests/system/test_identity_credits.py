"""Issue 36: an identity's credits spent exactly by all of its keys at once, with
`keysvc serve --workers 2` on SQLite (several processes on one file) and across two
`keysvc serve` instances on one PostgreSQL database (tests/pginstances.py's); and no
acknowledged increment lost, no spend counted twice, across kill -9.

The guarantee checked is the keys' (tests/credits.py, docs/SECURITY.md "Credits"),
for the identity: the granted costs sum to the credits before minus those after, and
every refusal was decided with fewer credits left than its cost."""

import contextlib
import re
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import pginstances
from tests.helpers import basic
from tests.pginstances import Client
from tests.server import Server, bootstrap, call

admin = pginstances.admin
two = pginstances.two

WORKERS = {"KEYSVC_WORKERS": "2"}
REFUSED = re.compile(r"credits exhausted for this key's identity: (\d+) remaining; ")
PARALLEL = 64
KEYS = 4


@dataclass(frozen=True)
class Answer:
    cost: int
    status: int
    remaining: int  # X-Credits-Identity-Remaining of a 200, or the refusal's count


def _verify(base: str, creds: dict[str, str], cost: int) -> Answer:
    headers = {**basic(creds["keyId"], creds["keySecret"]), "X-Credit-Cost": str(cost)}
    request = urllib.request.Request(base + "/v1/verify", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            left = int(response.headers["X-Credits-Identity-Remaining"])
            return Answer(cost, response.status, left)
    except urllib.error.HTTPError as refused:
        text = refused.read().decode()
        found = REFUSED.search(text)
        assert refused.code == 429 and found, (refused.code, text)
        return Answer(cost, refused.code, int(found.group(1)))


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


def _run(
    bases: Sequence[str], keys: Sequence[dict[str, str]], costs: Sequence[int]
) -> list[Answer]:
    """One verify per cost, PARALLEL at a time, over every key and every server."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        jobs = [
            pool.submit(_verify, bases[n % len(bases)], keys[n % len(keys)], cost)
            for n, cost in enumerate(costs)
        ]
        return [job.result() for job in jobs]


def _assert_exact(answers: Sequence[Answer], before: int, after: int) -> None:
    granted = sum(a.cost for a in answers if a.status == 200)
    assert granted <= before
    assert after == before - granted, (before, granted, after)
    for answer in answers:
        if answer.status == 429:
            assert answer.remaining < answer.cost and after < answer.cost, (answer, after)


def test_two_workers_grant_an_identitys_50_credits_exactly(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, 50)
        answers = _run([server.base], keys, [1] * 200)
        assert [a.status for a in answers].count(200) == 50
        assert sorted(a.remaining for a in answers if a.status == 200) == list(range(50))
        _assert_exact(answers, 50, _remaining(server.base, owner, identity_id))
        costs = _run([server.base], keys, [1 + n % 5 for n in range(20)])
        assert all(a.status == 429 for a in costs)


def test_two_workers_with_costs_1_to_5(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, 50)
        answers = _run([server.base], keys, [1 + n % 5 for n in range(200)])
        _assert_exact(answers, 50, _remaining(server.base, owner, identity_id))


def test_two_postgresql_instances_grant_an_identitys_credits_exactly(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = (client.server.base for client in two)
    identity_id, keys = _identity_keys(a, admin, 50)
    answers = _run([a, b], keys, [1] * 200)
    assert [x.status for x in answers].count(200) == 50
    _assert_exact(answers, 50, _remaining(b, admin, identity_id))
    # Nothing left: every cost, on either instance, is refused and spends nothing.
    costs = _run([b, a], keys, [1 + n % 5 for n in range(40)])
    _assert_exact(costs, 0, _remaining(a, admin, identity_id))


def test_kill_9_while_an_identitys_keys_spend_loses_no_acknowledged_increment(
    tmp_path: Path,
) -> None:
    """The keys' test (tests/system/test_credits_workers.py) on an identity's credits:
    after a restart, at least the last acknowledged set plus every acknowledged
    increment minus every spend that could have been made, at most that with the
    increment in flight too and only the acknowledged spends taken."""
    db = tmp_path / "k.db"
    owner = bootstrap(db)
    step, start = 1_000, 100
    counts = {"increments": 0, "granted": 0, "sent": 0}
    stop, lock = threading.Event(), threading.Lock()
    with Server(db, env=WORKERS) as server:
        identity_id, keys = _identity_keys(server.base, owner, start)
        url = f"/v1/organizations/{owner['organizationId']}/identities/{identity_id}/credits"

        def spender(creds: dict[str, str]) -> None:
            while not stop.is_set():
                with lock:
                    counts["sent"] += 1
                try:
                    answer = _verify(server.base, creds, 1)
                except OSError:
                    return  # the server is gone
                if answer.status == 200:
                    with lock:
                        counts["granted"] += 1

        threads = [threading.Thread(target=spender, args=(keys[n % KEYS],)) for n in range(8)]
        for thread in threads:
            thread.start()
        for _ in range(15):
            assert call(server.base, url, owner, "POST", {"increment": step})[0] == 200
            counts["increments"] += 1
        late = threading.Thread(target=_quietly, args=(server.base, url, owner, step))
        late.start()
        server.stop(signal.SIGKILL)
        stop.set()
        for thread in [*threads, late]:
            thread.join(timeout=60)
    with Server(db) as again:
        after = _remaining(again.base, owner, identity_id)
    assert counts["granted"] > 0  # the kill came while verifies were spending
    total = start + step * counts["increments"]
    in_flight = counts["sent"] - counts["granted"]
    assert total - counts["granted"] - in_flight <= after
    assert after <= total + step - counts["granted"]


def _quietly(base: str, url: str, owner: dict[str, Any], step: int) -> None:
    with contextlib.suppress(OSError):
        call(base, url, owner, "POST", {"increment": step})
