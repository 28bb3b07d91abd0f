"""The keys-by-state gauge: counted at most once per interval however many
scrapes come, concurrent ones sharing one count, and never on the connection
authentication reads with, so a scrape does not hold up a login."""

import asyncio
import time
from datetime import timedelta

import pytest

from keysvc.db import keys as store
from keysvc.db.dialect import Sql
from keysvc.http.state import IN_FLIGHT
from keysvc.metrics import KEYS_COUNTED_EVERY_SECONDS
from tests.api.metrics import scrape, status_of, value
from tests.helpers import Client, Creds, FakeClock, create_creds

EVERY = KEYS_COUNTED_EVERY_SECONDS
COUNTS = "keysvc_db_call_duration_seconds_count"


async def counted(client: Client) -> dict[str, float]:
    """The gauge, and how many counts have run so far (this scrape's included)."""
    _, samples = await scrape(client)
    gauge = {s: value(samples, "keysvc_keys", state=s) for s in ("enabled", "disabled", "expired")}
    return {**gauge, "counts": value(samples, COUNTS, operation="count_keys_by_state")}


async def test_concurrent_scrapes_share_one_count_per_interval(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    answers = await asyncio.gather(*(client.get("/metrics") for _ in range(20)))
    assert [answer.status for answer in answers] == [200] * 20
    for answer in answers:
        await answer.read()
    assert await counted(client) == {"enabled": 1, "disabled": 0, "expired": 0, "counts": 1}

    # A key expiring soon, and one disabled: not seen until the interval is over.
    soon = (clock.now + timedelta(seconds=EVERY + 5)).isoformat()
    await create_creds(client, admin, {"name": "soon", "roles": ["developer"], "expireAt": soon})
    await create_creds(client, admin, {"name": "off", "roles": ["developer"], "state": "disabled"})
    clock.advance(seconds=EVERY - 1)
    for _ in range(5):
        assert await counted(client) == {"enabled": 1, "disabled": 0, "expired": 0, "counts": 1}

    clock.advance(seconds=1)
    assert await counted(client) == {"enabled": 2, "disabled": 1, "expired": 0, "counts": 2}
    # "Expired" moves with time alone: the next count sees it.
    clock.advance(seconds=EVERY)
    assert await counted(client) == {"enabled": 1, "disabled": 1, "expired": 1, "counts": 3}
    # A clock set back does not keep old counts for longer.
    clock.advance(seconds=-3 * EVERY)
    assert (await counted(client))["counts"] == 4


# The store's count, made to take seconds (a scan of millions of rows does) by a
# subquery computed once; the counts it returns are the real ones.
_SLOW = 8_000_000


@pytest.fixture
def slow_count(monkeypatch: pytest.MonkeyPatch) -> None:
    spin = (
        "with recursive spin(i) as (select 1 union all select i + 1 from spin"
        f" where i < {_SLOW}) select count(*) from spin"
    )
    count = store.COUNT_KEYS_BY_STATE
    slow = Sql(
        f"select effective, n from ({count}) as counted where ({spin}) > 0",
        f"select effective, n from ({count.postgres}) as counted where ({spin}) > 0",
    )
    monkeypatch.setattr(store, "COUNT_KEYS_BY_STATE", slow)


@pytest.mark.usefixtures("slow_count")
async def test_a_first_login_does_not_wait_for_a_running_count(
    client: Client, admin: Creds
) -> None:
    """A key used for the first time is read from the database; that read must not
    queue behind the count of a scrape already under way."""
    started = time.monotonic()
    scraping = asyncio.create_task(counted(client))
    deadline = started + 30
    while client.app[IN_FLIGHT].count == 0:  # the scrape has reached the app
        assert time.monotonic() < deadline and not scraping.done()
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.2)  # and its count is running

    login_started = time.monotonic()
    assert await status_of(client, "GET", "/v1/whoami", admin.headers) == 200
    login = time.monotonic() - login_started
    assert not scraping.done(), "the login answered only once the count was over"

    assert await scraping == {"enabled": 1, "disabled": 0, "expired": 0, "counts": 1}
    scrape_took = time.monotonic() - started
    assert login * 4 < scrape_took, (login, scrape_took)
