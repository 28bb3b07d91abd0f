"""A key's usage series (GET .../keys/{keyId}/usage): what is counted, under which
outcome and minute, the buckets answered, who may read them, and the rows that go
(a deleted key's, and those past the retention)."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from keysvc.config import Settings
from keysvc.http.state import STORE
from tests.api.usage import (
    MOMENT,
    NOTHING,
    OUTCOMES,
    clock_at_moment,
    totals,
    usage,
    usage_url,
    written,
)
from tests.handsql import hand_sql, hand_value
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create_creds,
)


@pytest.fixture
def clock() -> FakeClock:
    return clock_at_moment()


async def status(client: Client, path: str, headers: dict[str, str], method: str = "GET") -> int:
    response = await client.request(method, path, headers=headers)
    response.release()
    return response.status


async def test_each_outcome_is_counted_once_for_its_key(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    keys_url = f"/v1/organizations/{admin.organization_id}/keys"
    assert await status(client, "/v1/whoami", dev.headers) == 200
    assert await status(client, "/v1/verify?permission=keys:read", dev.headers) == 200
    # Refused for its permission: the view's authorize, verify's own checks (two asked
    # of verify, both failing: one count), and another organization in the path.
    assert await status(client, keys_url, dev.headers, "POST") == 403
    other = f"/v1/verify?permission=reports:read&organization={uuid.uuid4()}"
    assert await status(client, other, dev.headers) == 403
    assert await status(client, f"/v1/organizations/{uuid.uuid4()}/keys", dev.headers) == 403
    # Not the key's: a wrong secret and an unknown key ID are counted nowhere.
    assert await status(client, "/v1/whoami", basic(dev.key_id, "wrong-secret")) == 401
    assert await status(client, "/v1/whoami", basic("unknown-id", dev.secret)) == 401
    assert await totals(client, admin, dev.id) == {**NOTHING, "success": 2, "forbidden": 3}

    patch = await client.patch(
        f"{keys_url}/{dev.id}", json={"state": "disabled"}, headers=admin.headers
    )
    await assert_ok(patch)
    assert await status(client, "/v1/whoami", dev.headers) == 401
    assert await totals(client, admin, dev.id) == {**NOTHING, "success": 2, "forbidden": 3,
                                                   "disabled": 1}  # fmt: skip


async def test_expired_ip_and_rate_limited_are_counted(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    soon = (MOMENT + timedelta(seconds=10)).isoformat()
    expiring = await create_creds(
        client, admin, {"name": "e", "roles": ["developer"], "expireAt": soon}
    )
    fenced = await create_creds(
        client,
        admin,
        {"name": "f", "roles": ["developer"], "ipAccessList": [{"source": "192.0.2.0/24"}]},
    )
    limited = await create_creds(
        client,
        admin,
        {"name": "l", "roles": ["developer"], "rateLimit": {"limit": 1, "windowSeconds": 3600}},
    )
    assert await status(client, "/v1/whoami", expiring.headers) == 200
    clock.advance(seconds=20)
    assert await status(client, "/v1/whoami", expiring.headers) == 401
    assert await status(client, "/v1/whoami", fenced.headers) == 403
    assert [await status(client, "/v1/whoami", limited.headers) for _ in range(3)] == [
        200,
        429,
        429,
    ]
    assert await totals(client, admin, expiring.id) == {**NOTHING, "success": 1, "expired": 1}
    assert await totals(client, admin, fenced.id) == {**NOTHING, "ipDenied": 1}
    assert await totals(client, admin, limited.id) == {**NOTHING, "success": 1, "rateLimited": 2}


async def test_buckets_are_zero_filled_and_whole(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    for _ in range(2):
        assert await status(client, "/v1/whoami", dev.headers) == 200  # 05:06
    clock.advance(minutes=2)
    assert await status(client, "/v1/whoami", dev.headers) == 200  # 05:08
    await written(client)
    # Rounded to whole minutes: 05:05:10 down, 05:08:01 up.
    result = await usage(
        client,
        admin,
        dev.id,
        **{"from": "2026-03-04T07:05:10+02:00", "to": "2026-03-04T05:08:01Z"},
        granularity="minute",
    )
    assert (result["granularity"], result["from"], result["to"]) == (
        "minute",
        "2026-03-04T05:05:00Z",
        "2026-03-04T05:09:00Z",
    )
    assert [(b["start"], b["success"]) for b in result["series"]] == [
        ("2026-03-04T05:05:00Z", 0),
        ("2026-03-04T05:06:00Z", 2),
        ("2026-03-04T05:07:00Z", 0),
        ("2026-03-04T05:08:00Z", 1),
    ]
    assert all(set(b) == {"start", *OUTCOMES} for b in result["series"])
    # The default: hourly, the last 24 hours up to now (05:08:30), whole hours.
    result = await usage(client, admin, dev.id)
    assert (result["granularity"], result["from"], result["to"]) == (
        "hour",
        "2026-03-03T05:00:00Z",
        "2026-03-04T06:00:00Z",
    )
    assert len(result["series"]) == 25
    assert [b["success"] for b in result["series"]] == [0] * 24 + [3]


async def test_counts_are_written_by_the_flush_alone(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """No request and no close needed: the background flush writes them."""
    client = await client_with(aiohttp_client, settings, clock, usage_flush_seconds=0.05)
    admin = await bootstrap(client.app)
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    for _ in range(3):
        assert await status(client, "/v1/whoami", dev.headers) == 200
    for _ in range(400):
        if hand_value(settings, "select sum(success) from key_usage where key_id = ?", dev.id) == 3:
            break
        await asyncio.sleep(0.05)
    rows = hand_sql(settings, "select minute, success from key_usage where key_id = ?", dev.id)
    assert rows == [("2026-03-04T05:06:00Z", 3)]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("from=yesterday", "from: must be an ISO-8601 date-time such as 2026-01-02T03:04:05Z"),
        ("to=2026-03-04T05:00:00", "to: must include a time zone offset, such as Z or +02:00"),
        ("granularity=week", "granularity: must be one of: minute, hour, day"),
        (
            "from=2026-03-04T05:00:01Z&to=2026-03-04T05:00:00Z",
            "from: must not be after to",
        ),
        (
            "from=2026-03-01T00:00:00Z&to=2026-03-02T00:00:01Z&granularity=minute",
            "from, to: ask for at most 1440 buckets of a minute, not 1441;"
            " narrow the range or choose a wider granularity",
        ),
        (
            "to=0001-01-01T00:00:00Z",
            "from, to: out of range; ask for dates from year 1 to 9999",
        ),
        ("granularity=day&granularity=hour", "granularity: given more than once"),
        ("limit=5", "limit: is not a known field"),
    ],
)
async def test_bad_queries_are_refused(
    client: Client, admin: Creds, query: str, message: str
) -> None:
    response = await client.get(f"{usage_url(admin, admin.id)}?{query}", headers=admin.headers)
    await assert_error(response, 400, message)


async def test_as_many_buckets_as_allowed_are_answered(client: Client, admin: Creds) -> None:
    result = await usage(
        client,
        admin,
        admin.id,
        **{"from": "2026-03-01T00:00:00Z", "to": "2026-03-02T00:00:00Z"},
        granularity="minute",
    )
    assert len(result["series"]) == 1440


async def test_who_may_read_a_keys_usage(client: Client, admin: Creds, other_admin: Creds) -> None:
    reader = await create_creds(client, admin, {"name": "r", "roles": ["developer"]})
    prober = await create_creds(client, admin, {"name": "q", "roles": ["query_endpoints"]})
    await usage(client, reader, admin.id)
    response = await client.get(usage_url(admin, admin.id), headers=prober.headers)
    await assert_error(response, 403, "this key lacks the permission keys:read")
    response = await client.get(usage_url(admin, admin.id), headers=other_admin.headers)
    await assert_error(response, 403, "this key does not belong to the organization in the path")
    # Another organization's key, or none at all, through this organization's path.
    for key_id in (other_admin.id, str(uuid.uuid4())):
        response = await client.get(usage_url(admin, key_id), headers=admin.headers)
        await assert_error(response, 404, "key not found in this organization")


async def test_a_deleted_keys_rows_go_with_it(
    client: Client, admin: Creds, settings: Settings
) -> None:
    gone = await create_creds(client, admin, {"name": "gone", "roles": ["developer"]})
    hand = await create_creds(client, admin, {"name": "by-hand", "roles": ["developer"]})
    for creds in (gone, hand, gone):
        assert await status(client, "/v1/whoami", creds.headers) == 200
    await written(client)
    counted = "select key_id, sum(success) from key_usage group by key_id"
    assert {gone.id: 2, hand.id: 1}.items() <= dict(hand_sql(settings, counted)).items()
    response = await client.delete(
        f"/v1/organizations/{admin.organization_id}/keys/{gone.id}", headers=admin.headers
    )
    await assert_ok(response)
    # By hand (on SQLite, the shell's way: foreign keys off).
    hand_sql(settings, "delete from api_keys where id = ?", hand.id)
    assert set(dict(hand_sql(settings, counted))) == {admin.id}
    # Counted after the key went: never written.
    assert await status(client, "/v1/whoami", gone.headers) == 401
    client.app[STORE].count_use(gone.id, MOMENT, 0)
    await written(client)
    assert hand_value(settings, "select count(*) from key_usage where key_id = ?", gone.id) == 0


async def test_rows_past_the_retention_are_pruned(
    aiohttp_client: ClientFactory,
    client: Client,
    admin: Creds,
    settings: Settings,
    clock: FakeClock,
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    now = datetime.now(UTC)
    for age in (40, 20, 0):
        clock.now = now - timedelta(days=age)
        assert await status(client, "/v1/whoami", dev.headers) == 200
    await written(client)

    def ages() -> list[int]:
        minutes = hand_sql(settings, "select minute from key_usage where key_id = ?", dev.id)
        return sorted(
            round((now - datetime.fromisoformat(minute)) / timedelta(days=1))
            for (minute,) in minutes
        )

    assert ages() == [0, 20, 40]
    # Another serving process on the same database prunes as it starts.
    await client_with(aiohttp_client, settings, clock, usage_retention_days=30)
    for _ in range(400):
        if ages() != [0, 20, 40]:
            break
        await asyncio.sleep(0.05)
    assert ages() == [0, 20]
