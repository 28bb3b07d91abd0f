"""What the system tests of credits share, a key's (issue 29) and an identity's, spent
by all of its keys at once (issue 36): many verifies at once against real servers,
spending while a server is killed with kill -9, and the checks of the exactness
guarantee (docs/SECURITY.md, "Credits").

The guarantee, checked as stated: over a run of verifies against one key's credits
(or one identity's, spent by any of its keys),
- never more granted than was there: the sum of the granted costs is at most the
  credits before the run, and the credits after it are exactly those before minus
  that sum (no spend lost, none counted twice);
- never a refusal while the key had credits for the cost: each refusal says how many
  remained when it was decided, which must be less than its cost; and, since credits
  only fall during the run, the credits after it are less than every refused cost.
"""

import contextlib
import re
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.helpers import basic
from tests.server import Server, call

# Verifies sent at once: enough to overlap on every server process.
PARALLEL = 64


@dataclass(frozen=True)
class Meter:
    """Whose credits a verify spends: the header of a 200 that says how many remain,
    and the 429's message that says so of a refusal."""

    header: str
    refused: re.Pattern[str]


KEY = Meter("X-Credits-Remaining", re.compile(r"credits exhausted for this key: (\d+) remaining; "))
IDENTITY = Meter(
    "X-Credits-Identity-Remaining",
    re.compile(r"credits exhausted for this key's identity: (\d+) remaining; "),
)


@dataclass(frozen=True)
class Answer:
    cost: int
    status: int
    remaining: int  # the meter's header of a 200, or the refusal's count


def verify(base: str, creds: dict[str, str], cost: int, meter: Meter = KEY) -> Answer:
    """One verify of ``cost``: its status and what it says remains of ``meter``'s credits."""
    headers = {**basic(creds["keyId"], creds["keySecret"]), "X-Credit-Cost": str(cost)}
    request = urllib.request.Request(base + "/v1/verify", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Answer(cost, response.status, int(response.headers[meter.header]))
    except urllib.error.HTTPError as refused:
        text = refused.read().decode()
        found = meter.refused.search(text)
        assert refused.code == 429 and found, (refused.code, text)
        return Answer(cost, refused.code, int(found.group(1)))


def run(
    bases: Sequence[str],
    keys: Sequence[dict[str, str]],
    costs: Sequence[int],
    meter: Meter = KEY,
) -> list[Answer]:
    """One verify per cost, ``PARALLEL`` at a time, spread over the servers ``bases`` and
    the ``keys`` (the creds of one key, or of each key of an identity)."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        jobs = [
            pool.submit(verify, bases[n % len(bases)], keys[n % len(keys)], cost, meter)
            for n, cost in enumerate(costs)
        ]
        return [job.result() for job in jobs]


def metered_key(base: str, admin: dict[str, str], credits: int) -> tuple[str, dict[str, str]]:
    """A key with ``credits`` and no request limit to get in the way: its UUID and creds."""
    body = {
        "name": "metered",
        "roles": ["developer"],
        "credits": {"remaining": credits},
        "rateLimit": {"limit": 1_000_000, "windowSeconds": 1},
    }
    status, made = call(
        base, f"/v1/organizations/{admin['organizationId']}/keys", admin, "POST", body
    )
    assert status == 200, made
    result = made["result"]
    return result["key"]["id"], {"keyId": result["keyId"], "keySecret": result["keySecret"]}


def remaining(base: str, admin: dict[str, str], key_id: str) -> int:
    status, got = call(base, f"/v1/organizations/{admin['organizationId']}/keys/{key_id}", admin)
    assert status == 200, got
    left: int = got["result"]["credits"]["remaining"]
    return left


def assert_exact(answers: Sequence[Answer], before: int, after: int) -> None:
    """The guarantee, as the module says, for ``answers`` from ``before`` to ``after``."""
    granted = sum(a.cost for a in answers if a.status == 200)
    assert granted <= before
    assert after == before - granted, (before, granted, after)
    for answer in answers:
        if answer.status == 429:
            assert answer.remaining < answer.cost, answer
            assert after < answer.cost, (after, answer)


# The kill -9 run: increments of STEP, acknowledged one by one, INCREMENTS of them.
STEP = 1_000
INCREMENTS = 15
SPENDERS = 8


@dataclass
class Tally:
    """What a kill -9 run saw acknowledged: increments, granted spends, verifies sent."""

    increments: int = 0
    granted: int = 0
    sent: int = 0


def spend_until_killed(
    server: Server,
    credits_url: str,
    owner: dict[str, Any],
    keys: Sequence[dict[str, str]],
    meter: Meter = KEY,
) -> Tally:
    """Verifies of cost 1 on SPENDERS threads (over ``keys`` in turn) while INCREMENTS
    increments of STEP to ``credits_url`` are acknowledged one by one; one more is sent
    (in flight when the server dies, or not: either is allowed), then kill -9."""
    tally, stop, lock = Tally(), threading.Event(), threading.Lock()

    def spender(creds: dict[str, str]) -> None:
        while not stop.is_set():
            with lock:
                tally.sent += 1
            try:
                answer = verify(server.base, creds, 1, meter)
            except OSError:
                return  # the server is gone
            if answer.status == 200:
                with lock:
                    tally.granted += 1

    def increment() -> int:
        return call(server.base, credits_url, owner, "POST", {"increment": STEP})[0]

    def late() -> None:
        with contextlib.suppress(OSError):
            increment()

    threads = [
        threading.Thread(target=spender, args=(keys[n % len(keys)],)) for n in range(SPENDERS)
    ]
    for thread in threads:
        thread.start()
    for _ in range(INCREMENTS):
        assert increment() == 200
        tally.increments += 1
    threads.append(threading.Thread(target=late))
    threads[-1].start()
    server.stop(signal.SIGKILL)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    return tally


def assert_kept(tally: Tally, start: int, after: int) -> None:
    """After a restart, the credits are at least ``start`` plus every acknowledged
    increment minus every spend that could have been made (acknowledged, or in flight),
    and at most that with the increment in flight too and only the acknowledged spends
    taken: no acknowledged increment lost, no spend counted twice."""
    assert tally.granted > 0  # the kill came while verifies were spending
    total = start + STEP * tally.increments
    in_flight = tally.sent - tally.granted
    assert total - tally.granted - in_flight <= after
    assert after <= total + STEP - tally.granted
