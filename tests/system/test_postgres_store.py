"""keysvc.db.postgres.store: the domain (keysvc.domain.keys) on PostgreSQL, and several instances
(stores) on one database, on a real server (tests/postgres.py). Writes are serial
across instances (the key cap and the activity chains hold under concurrent
creates), a change made through one is seen by the other's next read, and a lost
notification connection turns the caches off until a new one listens."""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime

import asyncpg
import pytest

from keysvc.credentials import ACTIVITY_CHAIN, Hasher
from keysvc.db.postgres.notifications import Notifications
from keysvc.db.postgres.store import PgStore
from keysvc.domain import keys
from keysvc.errors import Conflict
from keysvc.http.render import STORE_RECORDS
from keysvc.models import Actor, Key
from tests.helpers import hash_data
from tests.postgres import PEER_KEY, Postgres

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
HASHER = Hasher(b"p" * 32)
# Generous, for a loaded machine: a lost connection is noticed within about
# keysvc.db.postgres.store's PROBE_SECONDS + PROBE_TIMEOUT.
WAIT_SECONDS = 30.0


async def opened(url: str) -> PgStore:
    store = await PgStore.open_url(url, records=STORE_RECORDS, peer_key=PEER_KEY)
    await store.check_writable()
    await store.check_pepper(HASHER.fingerprint())
    await store.key_activities(HASHER.derive(ACTIVITY_CHAIN))
    return store


@pytest.fixture
async def instances(postgres: Postgres, pg_database: str) -> AsyncIterator[list[PgStore]]:
    """Two stores on one database, as two keysvc instances have."""
    async with AsyncExitStack() as stack:
        made = []
        for _ in range(2):
            store = await opened(postgres.url(pg_database))
            stack.push_async_callback(store.close)
            made.append(store)
        yield made


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await check():
        assert time.monotonic() < deadline, f"still not {what} after {WAIT_SECONDS} s"
        await asyncio.sleep(0.05)


async def disabled(store: PgStore, key_id_hash: bytes) -> bool:
    """Whether ``store`` finds the credential disabled now."""
    found = await store.find_credential(key_id_hash)
    return found is not None and found.key.state == "disabled"


async def admin(store: PgStore) -> Key:
    _, issued = await keys.bootstrap(store, HASHER, "acme", NOW)
    return issued.key


async def create(store: PgStore, caller: Key, name: str, max_keys: int = 100) -> keys.Issued:
    actor = Actor("api", caller.id)
    body = {"name": name, "roles": ["developer"]}
    return await keys.create_key(
        store, HASHER, caller, caller.organization_id, body, NOW, max_keys, actor
    )


async def made_on_a(a: PgStore, name: str) -> tuple[Key, keys.Issued, bytes]:
    """An admin, and a key it made through ``a``, with its key ID's keyed hash."""
    caller = await admin(a)
    issued = await create(a, caller, name)
    assert issued.key_id is not None
    return caller, issued, HASHER.of_plain(issued.key_id)


async def test_created_on_one_instance_is_read_on_the_other_at_once(
    instances: list[PgStore],
) -> None:
    a, b = instances
    caller, issued, key_id_hash = await made_on_a(a, "made on a")
    assert await b.get_key(caller.organization_id, issued.key.id) == issued.key
    found = await b.find_credential(key_id_hash)
    assert found is not None and found.key == issued.key
    page = await b.list_keys(caller.organization_id, 0, 10)
    assert [key.name for key in page.keys] == ["acme admin", "made on a"]


async def test_disabled_on_one_instance_is_refused_by_the_other(
    instances: list[PgStore],
) -> None:
    a, b = instances
    caller, issued, key_id_hash = await made_on_a(a, "k")
    found = await b.find_credential(key_id_hash)
    assert found is not None and found.key.state == "enabled"
    assert b.caches.cached_credential(key_id_hash) is not None  # b serves it from memory now
    await keys.update_key(
        a, caller, caller.organization_id, issued.key.id, {"state": "disabled"}, None,
        Actor("api", caller.id), NOW,
    )  # fmt: skip

    await until(lambda: disabled(b, key_id_hash), "disabled on b")


async def test_the_key_cap_holds_across_instances_creating_at_once(
    instances: list[PgStore],
) -> None:
    a, b = instances
    caller = await admin(a)
    limit = 6  # the admin key counts
    attempts = [create(store, caller, f"k{n}", limit) for n in range(6) for store in (a, b)]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    made = [r for r in results if isinstance(r, keys.Issued)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert (len(made), len(refused)) == (limit - 1, len(attempts) - limit + 1), results
    page = await b.list_keys(caller.organization_id, 0, 100)
    assert page.total == limit
    assert [key.org_seq for key in page.keys] == list(range(1, limit + 1))


async def test_the_activity_chain_holds_across_instances_writing_at_once(
    postgres: Postgres, pg_database: str, instances: list[PgStore]
) -> None:
    a, b = instances
    caller = await admin(a)
    await asyncio.gather(*(create(store, caller, f"k{n}") for n in range(5) for store in (a, b)))
    rows = postgres.psql(
        pg_database,
        "select org_seq, encode(prev_hash, 'hex'), encode(hash, 'hex') from activities"
        " order by org_seq",
    )
    assert [int(row[0]) for row in rows] == list(range(1, 12))
    for before, after in itertools.pairwise(rows):
        assert after[1] == before[2], "a link of the chain points elsewhere"
    (head,) = postgres.psql(
        pg_database, "select count, encode(last_hash, 'hex') from activity_heads"
    )
    assert head == ["11", rows[-1][2]]


async def test_a_lost_listener_turns_the_caches_off_until_it_is_back(
    postgres: Postgres, pg_database: str, instances: list[PgStore]
) -> None:
    a, b = instances
    _, issued, key_id_hash = await made_on_a(a, "k")
    await b.find_credential(key_id_hash)
    assert b.caches.cached_credential(key_id_hash) is not None
    lost_pid = b.notifications.backend_pid
    assert lost_pid is not None

    conn = await asyncpg.connect(postgres.url(pg_database))
    try:
        assert await conn.fetchval("select pg_terminate_backend($1)", lost_pid)
    finally:
        await conn.close()
    # Changed while b hears nothing: b must not go on answering from memory.
    started = time.monotonic()
    postgres.psql(
        pg_database, f"update api_keys set state = 'disabled' where id = '{issued.key.id}'"
    )

    await until(lambda: disabled(b, key_id_hash), "disabled on b")
    # Within the bound docs/SECURITY.md states; the wait allows for a loaded machine.
    assert time.monotonic() - started < WAIT_SECONDS
    assert b.notifications.losses == 1

    async def back() -> bool:
        notifications = b.notifications
        return notifications.listening.is_set() and notifications.backend_pid != lost_pid

    await until(back, "listening again")
    # Listening again: a read is kept and served from memory as before.
    await b.find_credential(key_id_hash)
    assert b.caches.cached_credential(key_id_hash) is not None


def test_while_not_listening_nothing_read_is_current() -> None:
    notifications = Notifications("postgresql://unused", PEER_KEY)
    first, first_generation = notifications.look(), notifications.generation
    assert notifications.look() != first
    assert notifications.generation != first_generation


async def test_a_create_refused_records_nothing(
    postgres: Postgres, pg_database: str, instances: list[PgStore]
) -> None:
    a, b = instances
    caller, issued, _ = await made_on_a(a, "first")
    assert issued.key_id is not None
    taken = {"name": "again", "roles": ["developer"], "hashData": hash_data(issued.key_id, "s")}
    before = postgres.psql(pg_database, "select count(*) from activities")
    with pytest.raises(Conflict, match="key with this key ID already exists"):
        await keys.create_key(
            b, HASHER, caller, caller.organization_id, taken, NOW, 100, Actor("api", caller.id)
        )
    assert postgres.psql(pg_database, "select count(*) from activities") == before
    assert (await a.list_keys(caller.organization_id, 0, 10)).total == 2


async def test_a_key_deleted_on_one_instance_is_a_tombstone_on_the_other(
    instances: list[PgStore],
) -> None:
    """The trigger keeps its credentials: the other instance finds them as deleted,
    never from its cache."""
    a, b = instances
    caller, issued, key_id_hash = await made_on_a(a, "k")
    assert await b.find_credential(key_id_hash) is not None
    await keys.delete_key(
        a, caller, caller.organization_id, issued.key.id, None, Actor("api", caller.id), NOW
    )

    async def tombstoned() -> bool:
        found = await b.find_credential(key_id_hash)
        return found is not None and found.deleted and found.key.id == issued.key.id

    await until(tombstoned, "a tombstone on b")
    assert b.caches.cached_credential(key_id_hash) is None
