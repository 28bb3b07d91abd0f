"""Request limits and the failed-login throttle shared by two instances on one
PostgreSQL database (keysvc.domain.sharedlimits): two apps from create_app on the same
database (tests/postgres.py), each with its own counters, as two `keysvc serve`
processes have, and two real `keysvc serve --workers 2` once. With --shared-limits
off each counts on its own, so the same traffic passes each limit twice: what shows
that the shared counts are what hold it."""

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from keysvc.config import Settings, build_settings
from keysvc.credentials import new_secret
from keysvc.db.postgres.schema import POSTGRES_MIGRATIONS
from keysvc.db.postgres.store import PgStore
from keysvc.db.sqlite.migrations import MIGRATIONS, SHARED_LIMITS_STEP, schema_version
from keysvc.domain.sharedlimits import BUDGET_SHARE, SharedCounts, budget_of
from keysvc.http.app import create_app
from keysvc.http.state import LIMITS
from tests.helpers import Client, ClientFactory, Creds, FakeClock, basic, bootstrap, create_creds
from tests.postgres import PEER_KEY, PEPPER, Postgres
from tests.server import Server, call, keysvc

# A window far longer than a test, begun after the real clock's now (FakeClock
# below): the counts' windows end only after the test.
WINDOW = 3600
FAILURES = 10
WAIT_SECONDS = 30.0
# Requests sent together, half to each instance.
AT_ONCE = 10


def overshoot(limit: int, processes: int) -> int:
    """docs/concepts/limits.md's bound: what ``processes`` processes may serve past ``limit``."""
    return (processes - 1) * math.ceil(limit / BUDGET_SHARE)


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    """The test's database; asked for before aiohttp_client, so that it is dropped
    only after the clients' apps have stopped."""
    return postgres.url(pg_database)


@pytest.fixture
def pg_clock() -> FakeClock:
    clock = FakeClock()
    start = math.ceil(time.time() / WINDOW) * WINDOW + 1
    clock.now = datetime.fromtimestamp(start, UTC)
    return clock


def settings_of(url: str, shared: bool) -> Settings:
    return Settings(db_url=url, pepper=PEPPER, auth_failures=FAILURES, shared_limits=shared)


async def two_clients(
    aiohttp_client: ClientFactory, url: str, clock: FakeClock, shared: bool = True
) -> tuple[Client, Client]:
    a = await aiohttp_client(create_app(settings_of(url, shared), clock=clock))
    b = await aiohttp_client(create_app(settings_of(url, shared), clock=clock))
    return a, b


async def limited_key(client: Client, limit: int) -> Creds:
    admin = await bootstrap(client.app)
    body = {
        "name": "ci",
        "roles": ["developer"],
        "rateLimit": {"limit": limit, "windowSeconds": WINDOW},
    }
    return await create_creds(client, admin, body)


def shared_of(client: Client) -> SharedCounts:
    shared = client.app[LIMITS].shared
    assert isinstance(shared, SharedCounts)
    return shared


async def statuses(clients: tuple[Client, ...], headers: dict[str, str], n: int) -> list[int]:
    """The statuses of ``n`` requests sent one at a time, to each client in turn."""
    seen = []
    for i in range(n):
        response = await clients[i % len(clients)].get("/v1/whoami", headers=headers)
        await response.read()
        seen.append(response.status)
    return seen


@pytest.fixture
async def pg(url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(url)
    yield conn
    await conn.close()


async def table_count(pg: Any, name_prefix: str) -> int:
    total = await pg.fetchval(
        "select coalesce(sum(count), 0) from shared_limits where name like $1", name_prefix + "%"
    )
    return int(total)


async def eventually_counted(pg: Any, name_prefix: str, expected: int) -> None:
    """Wait for the instances' periodic flushes to bring the table to ``expected``."""
    deadline = time.monotonic() + WAIT_SECONDS
    while await table_count(pg, name_prefix) != expected:
        assert time.monotonic() < deadline, await table_count(pg, name_prefix)
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("limit", [7, 40])
async def test_a_key_is_served_its_limit_across_two_instances_and_little_more(
    url: str, pg: Any, aiohttp_client: ClientFactory, pg_clock: FakeClock, limit: int
) -> None:
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    key = await limited_key(a, limit)
    seen = await statuses((a, b), key.headers, 3 * limit)
    allowed = seen.count(200)
    # None refused before the limit, and past it no more than the bound.
    assert limit <= allowed <= limit + overshoot(limit, 2), seen
    assert set(seen) == {200, 429}
    # Every request served is counted in the table, once.
    await eventually_counted(pg, f"k:{key.id}:", allowed)


async def test_with_shared_limits_off_each_instance_serves_the_limit(
    url: str, pg: Any, aiohttp_client: ClientFactory, pg_clock: FakeClock
) -> None:
    limit = 40
    a, b = await two_clients(aiohttp_client, url, pg_clock, shared=False)
    assert a.app[LIMITS].shared is None
    key = await limited_key(a, limit)
    seen = await statuses((a, b), key.headers, 3 * limit)
    assert seen.count(200) == 2 * limit
    assert await table_count(pg, "") == 0


async def test_requests_sent_at_once_to_both_stay_within_the_bound(
    url: str, aiohttp_client: ClientFactory, pg_clock: FakeClock
) -> None:
    limit = 50
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    key = await limited_key(a, limit)

    async def one(client: Client) -> int:
        response = await client.get("/v1/whoami", headers=key.headers)
        await response.read()
        return response.status

    seen: list[int] = []
    for _ in range(3 * limit // AT_ONCE):
        seen += await asyncio.gather(*(one((a, b)[i % 2]) for i in range(AT_ONCE)))
    assert limit <= seen.count(200) <= limit + overshoot(limit, 2)


async def test_a_request_makes_no_statement_for_its_count(
    url: str, pg: Any, aiohttp_client: ClientFactory, pg_clock: FakeClock
) -> None:
    limit, sent = 10_000, 400
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    key = await limited_key(a, limit)
    seen = await statuses((a, b), key.headers, sent)
    assert seen == [200] * sent
    await eventually_counted(pg, f"k:{key.id}:", sent)
    # One statement for many requests: each process sends its counts when they reach
    # half its budget (here 500), or once a second.
    flushes = shared_of(a).flushes + shared_of(b).flushes
    assert 2 <= flushes <= sent // 10, flushes


@pytest.mark.parametrize("shared", [True, False])
async def test_failed_logins_from_one_network_are_counted_across_instances(
    url: str, pg: Any, aiohttp_client: ClientFactory, pg_clock: FakeClock, shared: bool
) -> None:
    a, b = await two_clients(aiohttp_client, url, pg_clock, shared)
    key = await limited_key(a, 1000)
    wrong = basic(key.key_id, new_secret())
    seen = await statuses((a, b), wrong, 4 * FAILURES)
    failed = seen.count(401)
    if shared:
        assert FAILURES <= failed <= FAILURES + overshoot(FAILURES, 2), seen
        await eventually_counted(pg, "n:", failed)
        # The network is kept as a keyed hash, never as the address.
        names = [row["name"] for row in await pg.fetch("select name from shared_limits")]
        assert [name for name in names if name.startswith("n:")] and not any(
            "127.0.0.1" in name or "7f000001" in name for name in names
        )
    else:
        assert failed == 2 * FAILURES, seen
    assert set(seen) == {401, 429}
    # The address is refused even with the right secret, on either instance.
    for client in (a, b):
        assert (await client.get("/v1/whoami", headers=key.headers)).status == 429


async def test_a_network_blocked_through_one_instance_is_refused_by_the_other(
    url: str, aiohttp_client: ClientFactory, pg_clock: FakeClock
) -> None:
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    key = await limited_key(a, 1000)
    wrong = basic(key.key_id, new_secret())
    assert (await statuses((a,), wrong, FAILURES + 1))[-1] == 429
    # b saw no failure from it: it learns of the block from the table, within seconds.
    deadline = time.monotonic() + WAIT_SECONDS
    while (await b.get("/v1/whoami", headers=key.headers)).status != 429:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_without_the_counts_table_each_instance_counts_alone_then_shares_again(
    url: str,
    pg: Any,
    aiohttp_client: ClientFactory,
    pg_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = 20
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    key = await limited_key(a, limit)
    await pg.execute("alter table shared_limits rename to shared_limits_away")
    with caplog.at_level(logging.WARNING, logger="keysvc"):
        # Each instance serves the limit by its own count: none waits for ever, and
        # none fails a request.
        alone = await statuses((a,), key.headers, 2 * limit)
        assert alone.count(200) == limit and set(alone) == {200, 429}
        other = await statuses((b,), key.headers, 2 * limit)
        assert other.count(200) == limit
        assert shared_of(a).local and shared_of(b).local
        await asyncio.sleep(2.5)  # more flushes fail, logged no more
        down = [r for r in caplog.records if "does not answer" in r.getMessage()]
        assert len(down) == 2  # once per instance
        await pg.execute("alter table shared_limits_away rename to shared_limits")
        # The counts kept meanwhile are added once the table answers.
        await eventually_counted(pg, f"k:{key.id}:", 2 * limit)
        # An instance logs that it shares again once its flush's statement returns, a
        # moment after the commit the table shows: wait for both to have resumed.
        deadline = time.monotonic() + WAIT_SECONDS
        while shared_of(a).local or shared_of(b).local:
            assert time.monotonic() < deadline, "an instance never counted shared again"
            await asyncio.sleep(0.05)
    back = [r for r in caplog.records if "answers again" in r.getMessage()]
    assert len(back) == 2


def test_two_real_instances_of_two_workers_share_a_keys_limit(url: str) -> None:
    env = {"KEYSVC_PEPPER": PEPPER.hex()}
    done = keysvc("bootstrap", "--db", url, env=env)
    assert done.returncode == 0, done.stderr
    admin = json.loads(done.stdout)
    limit, processes = 30, 4
    # The longest window there is: a test does not straddle two.
    body = {
        "name": "ci",
        "roles": ["developer"],
        "rateLimit": {"limit": limit, "windowSeconds": 86_400},
    }
    with (
        Server(url, env=env, args=["--workers", "2"]) as a,  # type: ignore[arg-type]
        Server(url, env=env, args=["--workers", "2"]) as b,  # type: ignore[arg-type]
    ):
        status, made = call(
            a.base, f"/v1/organizations/{admin['organizationId']}/keys", admin, "POST", body
        )
        assert status == 200, made
        creds = {"keyId": made["result"]["keyId"], "keySecret": made["result"]["keySecret"]}
        seen = [call((a, b)[i % 2].base, "/v1/whoami", creds)[0] for i in range(3 * limit)]
        assert limit <= seen.count(200) <= limit + overshoot(limit, processes), seen
        assert set(seen) == {200, 429}
        for server in (a, b):
            assert server.stop() < 10


async def test_failures_from_ever_new_networks_do_not_grow_the_table(url: str, pg: Any) -> None:
    store = await PgStore.open_url(url, peer_key=PEER_KEY)
    try:
        shared = SharedCounts(store, bytes(32), FAILURES, max_names=5)
        now = time.time()
        for n in range(20):
            shared.failed(n.to_bytes(4, "big"), now)
        assert len(shared) == 5
        # One not followed is left to the process's FailureSketch.
        assert await shared.allows_failures((99).to_bytes(4, "big"), 1, now)
        await shared.close()
        assert await table_count(pg, "n:") == 5
    finally:
        await store.close()


async def test_adding_counts_announces_no_change_to_the_instances(url: str, pg: Any) -> None:
    """Counts are no data the caches hold: sending them must not turn every
    instance's caches cold (keysvc_data, keysvc.db.postgres.store) once a second."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    await pg.add_listener("keysvc_data", lambda *args: heard.put_nowait(args[2]))
    store = await PgStore.open_url(url, peer_key=PEER_KEY)
    try:
        shared = SharedCounts(store, bytes(32), FAILURES)
        now = time.time()
        await shared.hit("a-key", 5, WINDOW, now)
        shared.failed(b"4net", now)
        await shared.close()
        assert shared.flushes == 1 and await table_count(pg, "") == 2
    finally:
        await store.close()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(heard.get(), 1.0)


def test_shared_limits_default_on_and_can_be_turned_off() -> None:
    assert build_settings({}, {}).shared_limits is True
    assert build_settings({}, {"KEYSVC_SHARED_LIMITS": "off"}).shared_limits is False
    assert build_settings({"shared_limits": "off"}, {}).shared_limits is False


def test_a_budget_is_a_tenth_of_the_limit_and_at_least_one() -> None:
    assert [budget_of(n) for n in (1, 9, 10, 11, 100, 1001)] == [1, 1, 1, 2, 10, 101]


async def test_the_step_makes_an_unlogged_table_sqlite_numbers_alike(pg: Any) -> None:
    version = schema_version(MIGRATIONS[: MIGRATIONS.index(SHARED_LIMITS_STEP) + 1])
    assert version <= schema_version()
    await pg.execute("drop table shared_limits")
    await pg.execute(POSTGRES_MIGRATIONS[version])
    persistence = await pg.fetchval(
        "select relpersistence::text from pg_class where relname = 'shared_limits'"
    )
    assert persistence == "u"


# Issue 36: named rate limits, counted at a cost, shared as the request limits are.
async def named_key(client: Client, *limits: dict[str, Any]) -> Creds:
    admin = await bootstrap(client.app)
    return await create_creds(
        client, admin, {"name": "ai", "roles": ["developer"], "ratelimits": list(limits)}
    )


async def verify_statuses(
    clients: tuple[Client, ...], key: Creds, n: int, named: str, at_once: int = 1
) -> list[int]:
    """The statuses of ``n`` verifies naming ``named``, ``at_once`` at a time, to each
    client in turn."""

    async def one(client: Client) -> int:
        response = await client.get("/v1/verify", headers={**key.headers, "X-Ratelimit": named})
        await response.read()
        return response.status

    seen: list[int] = []
    for start in range(0, n, at_once):
        turn = range(start, min(n, start + at_once))
        seen += await asyncio.gather(*(one(clients[i % len(clients)]) for i in turn))
    return seen


@pytest.mark.parametrize(
    ("limit", "cost", "at_once"), [(1000, 30, 1), (1000, 30, AT_ONCE), (100, 40, 1)]
)
async def test_a_named_limit_is_shared_at_its_cost_across_two_instances(
    url: str,
    pg: Any,
    aiohttp_client: ClientFactory,
    pg_clock: FakeClock,
    limit: int,
    cost: int,
    at_once: int,
) -> None:
    """Units served stay within the stated bound, limit + (processes - 1) *
    max(budget, cost), and none is refused while the true count leaves room for the
    cost; every unit served is counted in the table once."""
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    tokens = {"name": "tokens", "limit": limit, "windowSeconds": WINDOW}
    key = await named_key(a, tokens)
    seen = await verify_statuses((a, b), key, 3 * limit // cost, f"tokens;cost={cost}", at_once)
    served = seen.count(200) * cost
    assert limit - cost < served <= limit + max(budget_of(limit), cost), seen
    assert set(seen) == {200, 429}
    await eventually_counted(pg, f"r:k:{key.id}:tokens:", served)


async def test_a_refusal_counts_against_no_other_limit_across_instances(
    url: str, pg: Any, aiohttp_client: ClientFactory, pg_clock: FakeClock
) -> None:
    a, b = await two_clients(aiohttp_client, url, pg_clock)
    burst = {"name": "burst", "limit": 1000, "windowSeconds": WINDOW, "autoApply": True}
    tokens = {"name": "tokens", "limit": 100, "windowSeconds": WINDOW}
    key = await named_key(a, burst, tokens)
    seen = await verify_statuses((a, b), key, 30, "tokens;cost=10")
    served = seen.count(200)
    assert 10 <= served <= 11 and seen.count(429) == 30 - served, seen
    await eventually_counted(pg, f"r:k:{key.id}:tokens:", 10 * served)
    await eventually_counted(pg, f"r:k:{key.id}:burst:", served)
