"""A key's usage series with the query's defaults: every granularity answers with no
``from`` or ``to``, within the most buckets a series may hold."""

import pytest

from keysvc.http.queries import MAX_USAGE_BUCKETS
from tests.api.usage import clock_at_moment, usage, written
from tests.helpers import Client, Creds, FakeClock, assert_ok, create_creds


@pytest.fixture
def clock() -> FakeClock:
    """Inside a minute, so that 24 hours before now is not a whole number of minutes."""
    return clock_at_moment()


@pytest.mark.parametrize(
    ("query", "start", "end", "count"),
    [
        # The last 1,440 minutes, the one holding now (05:06:30) included.
        ({"granularity": "minute"}, "2026-03-03T05:07:00Z", "2026-03-04T05:07:00Z", 1440),
        ({}, "2026-03-03T05:00:00Z", "2026-03-04T06:00:00Z", 25),
        ({"granularity": "hour"}, "2026-03-03T05:00:00Z", "2026-03-04T06:00:00Z", 25),
        ({"granularity": "day"}, "2026-03-03T00:00:00Z", "2026-03-05T00:00:00Z", 2),
        # A "to" inside a minute, and one on a minute's boundary.
        (
            {"granularity": "minute", "to": "2026-03-02T10:00:01Z"},
            "2026-03-01T10:01:00Z",
            "2026-03-02T10:01:00Z",
            1440,
        ),
        (
            {"granularity": "minute", "to": "2026-03-02T10:00:00+02:00"},
            "2026-03-01T08:00:00Z",
            "2026-03-02T08:00:00Z",
            1440,
        ),
    ],
)
async def test_every_granularity_works_with_its_defaults(
    client: Client, admin: Creds, query: dict[str, str], start: str, end: str, count: int
) -> None:
    result = await usage(client, admin, admin.id, **query)
    assert (result["from"], result["to"]) == (start, end)
    series = result["series"]
    assert len(series) == count <= MAX_USAGE_BUCKETS
    assert series[0]["start"] == start
    assert series[-1]["start"] < end


async def test_the_default_minute_series_holds_the_latest_requests(
    client: Client, admin: Creds
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await assert_ok(await client.get("/v1/whoami", headers=dev.headers))
    await written(client)
    series = (await usage(client, admin, dev.id, granularity="minute"))["series"]
    assert series[-1]["start"] == "2026-03-04T05:06:00Z"
    assert [bucket["success"] for bucket in series] == [0] * 1439 + [1]
