"""What the system tests of issue 29's credits share: many verifies at once against
real servers, and the checks of the exactness guarantee (docs/SECURITY.md, "Credits").

The guarantee, checked as stated: over a run of verifies against one key,
- never more granted than was there: the sum of the granted costs is at most the
  credits before the run, and the credits after it are exactly those before minus
  that sum (no spend lost, none counted twice);
- never a refusal while the key had credits for the cost: each refusal says how many
  remained when it was decided, which must be less than its cost; and, since credits
  only fall during the run, the credits after it are less than every refused cost.
"""

import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.helpers import basic
from tests.server import call

REFUSED = re.compile(r"credits exhausted for this key: (\d+) remaining; ")
# Verifies sent at once: enough to overlap on every server process.
PARALLEL = 64


@dataclass(frozen=True)
class Answer:
    cost: int
    status: int
    remaining: int | None  # X-Credits-Remaining of a 200, or the refusal's count


def verify(base: str, creds: dict[str, str], cost: int) -> Answer:
    """One verify of ``cost``: its status and what it says remains."""
    headers = {**basic(creds["keyId"], creds["keySecret"]), "X-Credit-Cost": str(cost)}
    request = urllib.request.Request(base + "/v1/verify", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Answer(cost, response.status, int(response.headers["X-Credits-Remaining"]))
    except urllib.error.HTTPError as refused:
        text = refused.read().decode()
        found = REFUSED.search(text)
        assert refused.code == 429 and found, (refused.code, text)
        return Answer(cost, refused.code, int(found.group(1)))


def run(bases: Sequence[str], creds: dict[str, str], costs: Sequence[int]) -> list[Answer]:
    """One verify per cost, ``PARALLEL`` at a time, spread over the servers ``bases``."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        jobs = [
            pool.submit(verify, bases[n % len(bases)], creds, cost) for n, cost in enumerate(costs)
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
            assert answer.remaining is not None and answer.remaining < answer.cost, answer
            assert after < answer.cost, (after, answer)
