"""A write transaction on PostgreSQL cancelled while its COMMIT is under way (the
request's task cancelled, as when the client goes away), on a real server
(tests/postgres.py): the write is either wholly in the database and this process's
caches know it at once, or wholly absent; either way the cancellation comes out as
CancelledError and the writer is free for the next write.

The test makes the COMMIT slow in its own database: a deferred constraint trigger on
api_keys runs at COMMIT and sleeps there (``pg_sleep``).
"""

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

from keysvc.credentials import ACTIVITY_CHAIN, Hasher
from keysvc.db.postgres.store import PgStore
from keysvc.domain import keys
from keysvc.http.render import STORE_RECORDS
from keysvc.models import Actor, Key
from tests.postgres import PEER_KEY, Postgres

HASHER = Hasher(b"c" * 32)
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
# Generous, for a loaded machine.
WAIT_SECONDS = 30.0


def slow_commits(postgres: Postgres, database: str, seconds: float) -> None:
    """Every COMMIT of a transaction that updated a key sleeps ``seconds`` first."""
    postgres.psql(
        database,
        "create function keysvc_test_slow_commit() returns trigger language plpgsql as $$"
        f" begin perform pg_sleep({seconds}); return null; end $$;"
        " create constraint trigger keysvc_test_slow_commit after update on api_keys"
        " deferrable initially deferred for each row"
        " execute function keysvc_test_slow_commit();",
    )


def state_in_database(postgres: Postgres, database: str, key_id: str) -> str:
    rows = postgres.psql(database, f"select state from api_keys where id = '{key_id}'")
    return rows[0][0]


def activities_recorded(postgres: Postgres, database: str) -> int:
    return int(postgres.psql(database, "select count(*) from activities")[0][0])


def wait_blocking(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` without letting the event loop run: what the loop would read
    meanwhile (the COMMIT's answer, notifications) stays unread in its sockets."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {WAIT_SECONDS} s"
        time.sleep(0.02)


@pytest.fixture
async def store(postgres: Postgres, pg_database: str) -> AsyncIterator[PgStore]:
    opened = await PgStore.open_url(
        postgres.url(pg_database), records=STORE_RECORDS, peer_key=PEER_KEY
    )
    try:
        await opened.check_pepper(HASHER.fingerprint())
        await opened.key_activities(HASHER.derive(ACTIVITY_CHAIN))
        yield opened
    finally:
        await opened.close()


async def cached_key(store: PgStore) -> tuple[Key, Key, bytes]:
    """An admin and a key it made, the key's credential cached by ``store``."""
    _, admin = await keys.bootstrap(store, HASHER, "acme", NOW)
    body = {"name": "victim", "roles": ["developer"]}
    actor = Actor("api", admin.key.id)
    issued = await keys.create_key(
        store, HASHER, admin.key, admin.key.organization_id, body, NOW, 100, actor
    )
    assert issued.key_id is not None
    key_id_hash = HASHER.of_plain(issued.key_id)
    assert await store.find_credential(key_id_hash) is not None
    assert store.caches.cached_credential(key_id_hash) is not None
    return admin.key, issued.key, key_id_hash


def disable(store: PgStore, caller: Key, key: Key) -> asyncio.Task[Key]:
    return asyncio.create_task(
        keys.update_key(
            store,
            caller,
            caller.organization_id,
            key.id,
            {"state": "disabled"},
            None,
            Actor("api", caller.id),
            NOW,
        )
    )


async def still_writable(store: PgStore, caller: Key, key: Key) -> None:
    renamed = await keys.update_key(
        store, caller, caller.organization_id, key.id, {"name": "after"}, None,
        Actor("api", caller.id), NOW,
    )  # fmt: skip
    assert renamed.name == "after"


async def until_committing(postgres: Postgres, database: str) -> None:
    """Until some session's COMMIT sleeps in the trigger, the loop running meanwhile."""
    sql = (
        "select count(*) from pg_stat_activity"
        " where wait_event = 'PgSleep' and datname = current_database()"
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while int(postgres.psql(database, sql)[0][0]) == 0:
        assert time.monotonic() < deadline, f"no COMMIT in the trigger after {WAIT_SECONDS} s"
        await asyncio.sleep(0.02)


async def test_cancelled_after_the_server_committed_counts_as_committed(
    postgres: Postgres, pg_database: str, store: PgStore
) -> None:
    caller, key, key_id_hash = await cached_key(store)
    slow_commits(postgres, pg_database, 0.5)
    task = disable(store, caller, key)
    await until_committing(postgres, pg_database)
    # This process's own notification of the commit is held back (its listening
    # connection's server process stopped), so only the writer can tell the caches.
    listener = store.notifications.backend_pid
    assert listener is not None
    os.kill(listener, signal.SIGSTOP)
    try:
        # The loop is held until the server has committed: the COMMIT's answer waits
        # unread, and the cancellation lands on the coroutine still awaiting it.
        wait_blocking(
            lambda: state_in_database(postgres, pg_database, key.id) == "disabled",
            "committed by the server",
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Still listening: the caches are not merely cold.
        assert store.notifications.listening.is_set() and store.notifications.losses == 0
        # Committed, and this process's caches know it.
        assert store.caches.cached_credential(key_id_hash) is None
        found = await store.find_credential(key_id_hash)
        assert found is not None and found.key.state == "disabled"
    finally:
        os.kill(listener, signal.SIGCONT)
    await still_writable(store, caller, key)


async def test_cancelled_during_the_commit_is_all_or_nothing(
    postgres: Postgres, pg_database: str, store: PgStore
) -> None:
    caller, key, key_id_hash = await cached_key(store)
    recorded = activities_recorded(postgres, pg_database)
    slow_commits(postgres, pg_database, 1.0)
    task = disable(store, caller, key)
    await until_committing(postgres, pg_database)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = state_in_database(postgres, pg_database, key.id)
    found = await store.find_credential(key_id_hash)
    assert found is not None
    if state == "disabled":  # committed: with its activity, and known here at once
        assert found.key.state == "disabled"
        assert activities_recorded(postgres, pg_database) == recorded + 1
    else:  # rolled back whole
        assert (state, found.key.state) == ("enabled", "enabled")
        assert activities_recorded(postgres, pg_database) == recorded
    await still_writable(store, caller, key)
