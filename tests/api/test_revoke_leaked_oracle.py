"""Revoke by secret tells nobody whether a secret was a key's, on both backends: the
answer's status, body and headers are the same for a hit as for a miss, its time too
(the work a hit causes comes after the answer, ``keysvc.domain.leaks.PendingReports``), and
/metrics says the same after either; the hits were acted on all the same."""

import statistics
import time
from typing import Any

from keysvc.config import Settings
from keysvc.credentials import new_secret
from keysvc.http.state import LEAK_REPORTS
from tests.api.activities import listed
from tests.api.metrics import Samples, scrape
from tests.api.webhooks import private_client
from tests.helpers import Client, ClientFactory, FakeClock, bootstrap, create_creds

REVOKE = "/v1/keys/revoke-leaked"
SAMPLES = 100
# Headers that differ between any two answers, whatever they say.
PER_ANSWER = {"x-request-id", "date"}
# What a scrape's request series say of the requests' own time, which the timing test
# below covers: every other sample must move alike for a hit and a miss.
ANSWER_TIME = ("keysvc_http_request_duration_seconds_bucket",
               "keysvc_http_request_duration_seconds_sum")  # fmt: skip


async def _report(client: Client, secret: str) -> tuple[float, int, dict[str, Any], dict[str, str]]:
    started = time.perf_counter()
    response = await client.post(REVOKE, json={"secret": secret})
    body = await response.json()
    took = time.perf_counter() - started
    await client.app[LEAK_REPORTS].work_through()  # the work, out of the next sample's way
    del body["requestId"]
    headers = {k: v for k, v in response.headers.items() if k.lower() not in PER_ANSWER}
    return took, response.status, body, headers


async def _notify_client(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> Client:
    # notify: a hit's work is a record and an event, every time a new key's, and the
    # throttle out of the way of 200 reports from one address.
    return await private_client(
        aiohttp_client, settings, clock, leaked_key_action="notify", auth_failures=100_000
    )


async def test_a_hit_and_a_miss_answer_alike_and_in_the_same_time(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await _notify_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    keys = [
        await create_creds(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        for n in range(SAMPLES)
    ]
    hits, misses = [], []
    for key in keys:  # interleaved, so that any drift touches both alike
        hits.append(await _report(client, key.secret))
        misses.append(await _report(client, new_secret()))
    answers = {(status, repr(body), repr(sorted(h.items()))) for _, status, body, h in hits}
    assert answers == {(s, repr(b), repr(sorted(h.items()))) for _, s, b, h in misses}
    assert len(answers) == 1 and next(iter(answers))[0] == 200
    hit_time = statistics.median(took for took, *_ in hits)
    miss_time = statistics.median(took for took, *_ in misses)
    # Before the work came after the answer a hit took about twice a miss's time; a
    # loose bound, that noise on a shared machine does not cross.
    assert hit_time < miss_time * 1.3 + 0.0005, (hit_time, miss_time)
    # And the hits were acted on: one key_leaked record each.
    leaked = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert len(leaked) == SAMPLES


def _moved(before: Samples, after: Samples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        series: after[series] - before.get(series, 0.0)
        for series in after
        if series[0] not in ANSWER_TIME and after[series] != before.get(series, 0.0)
        and not series[0].endswith("_created")
    }  # fmt: skip


async def test_metrics_say_the_same_after_a_hit_as_after_a_miss(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await _notify_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    moved = []
    for secret in (made.secret, new_secret()):
        _, before = await scrape(client)
        await _report(client, secret)
        _, after = await scrape(client)
        moved.append(_moved(before, after))
    hit, miss = moved
    assert hit == miss
    assert not any("report_leak" in str(series) for series in hit)
