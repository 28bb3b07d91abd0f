"""Issue 36 on /v1/verify, through the real app on both backends: a key's autoApply
limits are counted on every verify, the others when the verify names them (X-Ratelimit
or ?ratelimit=) at the cost named; past any limit a 429 with that limit's Retry-After
and X-RateLimit-* headers, and nothing counted against the others; the JSON answer
lists every limit checked; bad names and costs are 400s that say where."""

import asyncio
from typing import Any

import pytest

from keysvc.config import Settings
from tests.api.usage import NOTHING, clock_at_moment, totals
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    client_with,
    create_creds,
)

VERIFY = "/v1/verify"
JSON = {"Accept": "application/json"}
BURST = {"name": "burst", "limit": 3, "windowSeconds": 10, "autoApply": True}
TOKENS = {"name": "tokens", "limit": 1000, "windowSeconds": 60}
DAY = {"name": "day", "limit": 5, "windowSeconds": 86400}


async def _limited(client: Client, admin: Creds, *limits: dict[str, Any], **extra: Any) -> Creds:
    body = {"name": "limited", "roles": ["developer"], "ratelimits": list(limits), **extra}
    return await create_creds(client, admin, body)


def _at_window_start(clock: FakeClock) -> None:
    """At a minute's start, which is also the start of each 10 s and 60 s window."""
    clock.now = clock.now.replace(second=0, microsecond=0)


async def _checked(client: Client, key: Creds, url: str = VERIFY, **headers: str) -> Any:
    response = await client.get(url, headers={**key.headers, **JSON, **headers})
    return (await assert_ok(response))["ratelimits"]


def _standing(name: str, limit: int, remaining: int, reset: int) -> dict[str, Any]:
    return {"name": name, "limit": limit, "remaining": remaining, "reset": reset, "exceeded": False}


async def test_an_auto_apply_limit_counts_every_verify(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, BURST)
    _at_window_start(clock)
    for left in (2, 1):
        assert await _checked(client, key) == [_standing("burst", 3, left, 10)]
    plain = await client.get(VERIFY, headers=key.headers)
    assert plain.status == 200
    assert (plain.headers["Cache-Control"], plain.headers["X-Accel-Expires"]) == ("no-store", "0")
    clock.advance(seconds=4)
    refused = await client.get(VERIFY, headers=key.headers)
    await assert_error(
        refused, 429, "rate limit burst exceeded for this key: 3 per 10 s; retry in 6 s"
    )
    assert refused.headers["Retry-After"] == "6"
    assert refused.headers["X-RateLimit-Limit"] == "3"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    assert refused.headers["X-RateLimit-Reset"] == "6"
    clock.advance(seconds=6)  # the next window
    assert await _checked(client, key) == [_standing("burst", 3, 2, 10)]


async def test_a_named_limit_counts_only_when_named_at_its_cost(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, TOKENS)
    _at_window_start(clock)
    assert "ratelimits" not in await assert_ok(
        await client.get(VERIFY, headers={**key.headers, **JSON})
    )
    named = await _checked(client, key, **{"X-Ratelimit": "tokens;cost=512"})
    assert named == [_standing("tokens", 1000, 488, 60)]
    assert await _checked(client, key, **{"X-Ratelimit": "tokens"}) == [
        _standing("tokens", 1000, 487, 60)
    ]
    # Cost 0 checks without counting.
    assert await _checked(client, key, **{"X-Ratelimit": "tokens;cost=0"}) == [
        _standing("tokens", 1000, 487, 60)
    ]
    refused = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": "tokens;cost=488"})
    await assert_error(
        refused, 429, "rate limit tokens exceeded for this key: 1000 per 60 s; retry in 60 s"
    )
    assert refused.headers["X-RateLimit-Remaining"] == "487"
    assert await _checked(client, key, **{"X-Ratelimit": "tokens;cost=487"}) == [
        _standing("tokens", 1000, 0, 60)
    ]
    # Used up: a check of cost 0 is refused too.
    zero = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": "tokens;cost=0"})
    assert zero.status == 429


async def test_a_refused_verify_counts_against_none(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, BURST, TOKENS, DAY)
    _at_window_start(clock)
    first = await _checked(client, key, **{"X-Ratelimit": "tokens;cost=900, day"})
    assert first == [
        _standing("burst", 3, 2, 10),
        _standing("tokens", 1000, 100, 60),
        _standing("day", 5, 4, int(86400 - clock.now.timestamp() % 86400)),
    ]
    # tokens refuses: neither burst nor day is counted.
    refused = await client.get(
        VERIFY, headers={**key.headers, "X-Ratelimit": "day", **{"x-ratelimit": "tokens;cost=101"}}
    )
    assert refused.status == 429
    assert refused.headers["X-RateLimit-Limit"] == "1000"
    after = await _checked(client, key, **{"X-Ratelimit": "tokens;cost=100,day"})
    assert [(s["name"], s["remaining"]) for s in after] == [
        ("burst", 1),
        ("tokens", 0),
        ("day", 3),
    ]


async def test_repeated_header_lines_are_read_together(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, TOKENS, DAY)
    _at_window_start(clock)
    headers = [
        *key.headers.items(),
        *JSON.items(),
        ("X-Ratelimit", "day"),
        ("X-Ratelimit", "tokens;cost=7"),
    ]
    response = await client.get(VERIFY, headers=headers)
    checked = (await assert_ok(response))["ratelimits"]
    assert [(s["name"], s["remaining"]) for s in checked] == [("tokens", 993), ("day", 4)]


async def test_the_query_decides_alone(client: Client, admin: Creds, clock: FakeClock) -> None:
    """A proxy that names limits in the query is not overridden by a forwarded header:
    the header's lower cost and its other names are not read."""
    key = await _limited(client, admin, TOKENS, DAY)
    _at_window_start(clock)
    url = VERIFY + "?ratelimit=tokens:300&ratelimit=day"
    checked = await _checked(client, key, url, **{"X-Ratelimit": "tokens;cost=0"})
    assert [(s["name"], s["remaining"]) for s in checked] == [("tokens", 700), ("day", 4)]
    only = await _checked(client, key, VERIFY + "?ratelimit=tokens", **{"X-Ratelimit": "day"})
    assert [(s["name"], s["remaining"]) for s in only] == [("tokens", 699)]


async def test_a_named_auto_apply_limit_counts_at_the_cost_named(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, {**TOKENS, "autoApply": True})
    _at_window_start(clock)
    assert [s["remaining"] for s in await _checked(client, key)] == [999]
    named = await _checked(client, key, VERIFY + "?ratelimit=tokens:99")
    assert [s["remaining"] for s in named] == [900]


async def test_rate_limit_keeps_working_beside_them(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, BURST, rateLimit={"limit": 10, "windowSeconds": 60})
    _at_window_start(clock)
    response = await client.get(VERIFY, headers={**key.headers, **JSON})
    body = await assert_ok(response)
    assert body["ratelimit"] == {"limit": 10, "remaining": 9, "reset": 60}
    assert body["ratelimits"] == [_standing("burst", 3, 2, 10)]
    assert response.headers["X-RateLimit-Limit"] == "10"


async def test_a_changed_limit_applies_at_once(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _limited(client, admin, TOKENS)
    _at_window_start(clock)
    await _checked(client, key, **{"X-Ratelimit": "tokens;cost=10"})
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    patch = {"ratelimits": [{**TOKENS, "limit": 15}]}
    await assert_ok(await client.patch(url, json=patch, headers=admin.headers))
    assert [s["remaining"] for s in await _checked(client, key, **{"X-Ratelimit": "tokens"})] == [4]
    await assert_ok(await client.patch(url, json={"ratelimits": None}, headers=admin.headers))
    gone = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": "tokens"})
    await assert_error(gone, 400, "ratelimit: this key has no rate limit named tokens")


async def test_a_key_without_them_verifies_as_before(client: Client, admin: Creds) -> None:
    key = await create_creds(client, admin, {"name": "plain", "roles": ["developer"]})
    body = await assert_ok(await client.get(VERIFY, headers={**key.headers, **JSON}))
    assert "ratelimits" not in body
    blank = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": " "})
    assert blank.status == 200
    named = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": "tokens"})
    await assert_error(named, 400, "ratelimit: this key has no rate limit named tokens")


async def test_a_blank_header_names_nothing(client: Client, admin: Creds, clock: FakeClock) -> None:
    """A proxy sets X-Ratelimit from a map whose default is "" (docs/Caddyfile): blank
    lines name no limit, and only the autoApply ones count."""
    key = await _limited(client, admin, BURST, TOKENS)
    _at_window_start(clock)
    for blank in ("", " "):
        assert await _checked(client, key, **{"X-Ratelimit": blank}) == [
            _standing("burst", 3, 2, 10)
        ]
        clock.advance(seconds=10)


SEVENTEEN = ",".join(f"n{i}" for i in range(17))
TOO_LONG = ",".join(["a" * 64 + ";cost=1000000"] * 40)


NAME = "a name must be 1 to 64 of a-z, 0-9, _, . and -"
COST = "the cost must be an integer from 0 to 1000000"
ITEM = "ratelimit: X-Ratelimit item {}: "
PARAM = "ratelimit: ?ratelimit= #1: "


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("header", "Tokens", ITEM.format(1) + NAME),
        ("header", "tokens,", ITEM.format(2) + NAME),
        ("header", "tokens;cost=-1", ITEM.format(1) + COST),
        ("header", "tokens;cost=1000001", ITEM.format(1) + COST),
        ("header", "tokens;cost=1.5", ITEM.format(1) + COST),
        ("header", "tokens;cost=", ITEM.format(1) + COST),
        ("header", "tokens;weight=2", ITEM.format(1) + "expected name or name;cost=N"),
        ("header", "tokens, tokens;cost=2", ITEM.format(2) + "tokens is named twice"),
        ("header", SEVENTEEN, "ratelimit: at most 16 limits may be named"),
        ("header", TOO_LONG, "ratelimit: X-Ratelimit is longer than 2048 characters"),
        ("query", "tokens:x", PARAM + COST),
        ("query", "tokens;cost=1", PARAM + NAME),
        ("query", "", PARAM + NAME),
        ("query", "t\u00e9", PARAM + NAME),
        ("query", "day", "ratelimit: this key has no rate limit named day"),
    ],
)  # fmt: skip
async def test_bad_names_and_costs_are_400s(
    client: Client, admin: Creds, where: str, value: str, message: str
) -> None:
    key = await _limited(client, admin, TOKENS)
    if where == "header":
        response = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": value})
    else:
        response = await client.get(VERIFY, headers=key.headers, params={"ratelimit": value})
    await assert_error(response, 400, message)
    # Nothing was counted.
    left = await _checked(client, key, **{"X-Ratelimit": "tokens;cost=0"})
    assert left[0]["remaining"] == 1000


async def test_a_refusal_is_counted_in_usage_as_rate_limited(
    aiohttp_client: ClientFactory, settings: Settings
) -> None:
    client = await client_with(aiohttp_client, settings, clock_at_moment())
    admin = await bootstrap(client.app)
    key = await _limited(client, admin, {**BURST, "limit": 1})
    for _ in range(3):
        await client.get(VERIFY, headers=key.headers)
    assert await totals(client, admin, key.id) == {**NOTHING, "success": 1, "rateLimited": 2}


async def test_verifies_at_once_are_counted_exactly(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    """Checked and counted with nothing awaited between, in one process: 20 verifies of
    cost 3 sent together against 30 units, exactly 10 served, and the autoApply limit
    beside counts those 10 alone."""
    key = await _limited(client, admin, {**TOKENS, "limit": 30}, {**BURST, "limit": 100})
    _at_window_start(clock)

    async def one() -> int:
        response = await client.get(VERIFY, headers={**key.headers, "X-Ratelimit": "tokens;cost=3"})
        await response.read()
        return response.status

    seen = await asyncio.gather(*(one() for _ in range(20)))
    assert sorted(seen) == [200] * 10 + [429] * 10
    left = await _checked(client, key)
    assert [(s["name"], s["remaining"]) for s in left] == [("burst", 89)]
