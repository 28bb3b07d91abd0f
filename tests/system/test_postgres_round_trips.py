"""keysvc.db.postgres.store on a real server (tests/postgres.py): what a read or a commit costs
beyond its own statements. A pooled connection goes back to the pool without a reset
statement (keysvc leaves no session state on one), and an instance's own commit,
announced and heard back on its listening connection, moves the data version once,
not twice: else every key read since that commit would be read again."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from keysvc.db.postgres.store import PgStore
from tests.postgres import PEER_KEY, Postgres

# Generous, for a loaded machine.
WAIT_SECONDS = 30.0


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    return postgres.url(pg_database)


@pytest.fixture
async def store(url: str) -> AsyncIterator[PgStore]:
    opened = await PgStore.open_url(url, peer_key=PEER_KEY)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_pooled_read_gives_its_connection_back_without_a_reset_statement(
    store: PgStore, url: str
) -> None:
    assert await store.get_key(str(uuid.uuid4()), str(uuid.uuid4())) is None  # read, not cached
    async with store.transaction("round_trip_test"):
        pass
    watcher = await asyncpg.connect(url)
    try:
        last = await watcher.fetch(
            "select query from pg_stat_activity"
            " where datname = current_database() and pid <> pg_backend_pid()"
            " and backend_type = 'client backend'"
        )
    finally:
        await watcher.close()
    queries = [row["query"] for row in last]
    assert queries  # the pooled connections and the listening one
    assert not [query for query in queries if "pg_advisory_unlock_all" in query], queries


# A transaction that writes nothing, and one whose write the table's trigger announces
# as well (schema step 12): the trigger's announcement is the writer's own too.
WRITES = ("", "update meta set value = value where name = 'schema_version'")


@pytest.mark.parametrize("write", WRITES, ids=["nothing", "a row"])
async def test_its_own_commit_heard_back_does_not_move_the_version_again(
    store: PgStore, url: str, write: str
) -> None:
    before = store.caches.data_version()
    async with store.transaction("round_trip_test") as conn:
        if write:
            await conn.execute(write)
    # Another session's change of the generation, committed after the store's: one
    # queue delivers the announcements in commit order, so once the store has read the
    # generation it announced, it has heard its own commit. (The generation is read
    # from the database, not taken from the announcement: any session may send one.)
    other = await asyncpg.connect(url)
    try:
        marker = await other.fetchval(
            "update meta set value = (value::bigint + 1)::text"
            " where name = 'auth_generation' returning value"
        )
    finally:
        await other.close()

    def heard() -> bool:
        store.caches.data_version()  # takes in the generation last announced
        return store.caches.generation == marker

    deadline = time.monotonic() + WAIT_SECONDS
    while not heard():
        assert time.monotonic() < deadline, f"the store never heard {marker}"
        await asyncio.sleep(0.02)
    # One move for its commit, one for the other session's.
    assert store.caches.data_version() == before + 2
