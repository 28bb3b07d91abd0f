"""Grouped writes: creates and usedAt writes that arrive together share one
transaction of a few statements, and a create that a constraint refuses fails alone."""

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from keysvc.db.sqlite import createbatch as store_module
from keysvc.db.sqlite.store import Store
from keysvc.domain.activities import SYSTEM, announcer
from keysvc.errors import Conflict
from keysvc.http.state import CLOCK, HASHER, SETTINGS, STORE
from keysvc.models import Key, NewKey
from keysvc.timeutil import to_minute, to_text
from tests.api.createtrace import trace_creates
from tests.helpers import Client, Creds, FakeClock, count_statements

# What a create by keysvc itself records: these tests call the store directly.
ANNOUNCE = announcer(SYSTEM, FakeClock()())


async def new_keys(client: Client, org: str, count: int, prefix: str = "k") -> list[NewKey]:
    store, hasher = client.app[STORE], client.app[HASHER]
    (developer,) = await store.roles.resolve_roles(org, ["developer"], [])
    return [
        NewKey(
            organization_id=org,
            name=f"{prefix}{n}",
            state="enabled",
            key_id_hash=hasher.of_plain(f"{prefix}-id-{n}"),
            secret_hash=hasher.of_plain(f"{prefix}-secret-{n}"),
            key_suffix=f"{n:04d}",
            created_at=client.app[CLOCK](),
            role_ids=[developer.id, developer.id],  # a role named twice is held once
        )
        for n in range(count)
    ]


async def outcomes(store: Store, news: list[NewKey], max_keys: int) -> list[Key | Exception]:
    results = await asyncio.gather(
        *(store.create_key(new, max_keys, ANNOUNCE) for new in news), return_exceptions=True
    )
    assert not [r for r in results if not isinstance(r, Key | Exception)]
    return [r for r in results if isinstance(r, Key | Exception)]


def count_batches(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch written, from now on."""
    batches: list[int] = []
    run = store._creates.thread.run

    async def counted(batch: list[tuple[NewKey, int]]) -> Any:
        batches.append(len(batch))
        return await run(batch)

    monkeypatch.setattr(store._creates.thread, "run", counted)
    return batches


@pytest.mark.sqlite_only  # SQLite's create batches (keysvc.db.sqlite.createbatch)
async def test_a_batch_of_creates_is_one_transaction_of_few_statements(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app[STORE]
    news = await new_keys(client, admin.organization_id, 30)
    statements: list[str] = []
    await trace_creates(store, lambda sql: statements.append(" ".join(sql.split())))
    batches = count_batches(store, monkeypatch)
    made = await outcomes(store, news, 1000)
    await trace_creates(store, None)
    # SQLite reports each trigger run as its statement again: one run of each is kept.
    statements = [s for n, s in enumerate(statements) if n == 0 or s != statements[n - 1]]
    assert batches == [30]  # one batch, one transaction
    # begin without waiting (nobody else in the process holds the write lock): the
    # connection's busy timeout is 0 but around a begin on its thread
    assert statements[:2] == ["begin immediate", "savepoint whole_batch"]
    assert statements[-2] == "release whole_batch" and statements[-1] == "commit"
    # One statement a table, whatever the number of keys; the reads (the authorization
    # generation, the organization's count, the keys and their roles back, the webhooks
    # subscribed to key.created) once; then, in the same savepoint, the keys' activities:
    # their chain's head read, one insert for them all, the organization's write budget
    # charged, the head moved; and the generation put back as it was (the key_roles
    # triggers moved it: see _stage_batch).
    assert sum(s.startswith("insert into api_keys") for s in statements) == 1
    assert sum(s.startswith("insert into key_roles") for s in statements) == 1
    assert sum(s.startswith("insert into activities") for s in statements) == 1
    assert sum(s.startswith("insert into activity_heads") for s in statements) == 1
    assert sum(s.startswith("insert into write_budgets") for s in statements) == 1
    assert sum(s.startswith("select") for s in statements) == 6
    assert statements[-3].startswith("update meta set value = ")
    assert len(statements) == 16
    assert all(isinstance(key, Key) for key in made)
    keys = [key for key in made if isinstance(key, Key)]
    assert [key.name for key in keys] == [f"k{n}" for n in range(30)]
    assert [key.seq for key in keys] == sorted(key.seq for key in keys)  # in arrival order
    assert {tuple(role.name for role in key.roles) for key in keys} == {("developer",)}
    for key in keys:  # what each request was answered is what is stored
        assert await store.get_key(admin.organization_id, key.id) == key


async def test_a_taken_key_id_fails_alone(client: Client, admin: Creds) -> None:
    store = client.app[STORE]
    news = await new_keys(client, admin.organization_id, 6)
    await store.create_key(news[3], 1000, ANNOUNCE)
    made = await outcomes(store, news, 1000)
    refused = made.pop(3)
    assert isinstance(refused, Conflict)
    assert refused.message == "hashData.keyIdHash: a key with this key ID already exists"
    assert [key.name for key in made if isinstance(key, Key)] == ["k0", "k1", "k2", "k4", "k5"]
    listed = await store.list_keys(admin.organization_id, 0, 100)
    assert [key.name for key in listed.keys] == ["acme admin", "k3", "k0", "k1", "k2", "k4", "k5"]
    assert listed.total == 7  # the refused batch's count (a trigger's) was undone too


async def test_creates_beyond_the_limit_fail_in_arrival_order(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    store = client.app[STORE]
    ours = await new_keys(client, admin.organization_id, 5, "a")
    theirs = await new_keys(client, other_admin.organization_id, 2, "o")
    mixed = [ours[0], theirs[0], ours[1], ours[2], theirs[1], ours[3], ours[4]]
    made = await outcomes(store, mixed, 4)  # each organization has its admin key already
    names = [key.name if isinstance(key, Key) else str(key) for key in made]
    limit = "this organization has reached its limit of 4 keys"
    assert names == ["a0", "o0", "a1", "a2", "o1", limit, limit]
    assert (await store.list_keys(admin.organization_id, 0, 100)).total == 4
    assert (await store.list_keys(other_admin.organization_id, 0, 100)).total == 3


@pytest.mark.sqlite_only  # counts the statements of SQLite's writer connection
async def test_used_at_writes_that_arrive_together_share_a_transaction(
    client: Client, admin: Creds, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = client.app[STORE]
    keys = [k for k in await outcomes(store, await new_keys(client, admin.organization_id, 12), 99)
            if isinstance(k, Key)]  # fmt: skip
    minute = to_minute(clock.now + timedelta(minutes=5))
    statements = count_statements(store.writer.conn, monkeypatch)
    await asyncio.gather(*(store.touch_used(key.id, minute) for key in keys))
    assert statements.count("begin immediate") == 1 and len(statements) == 3
    earlier = minute - timedelta(minutes=1)
    await store.touch_used(keys[0].id, earlier)  # never moves usedAt back
    raw = sqlite3.connect(client.app[SETTINGS].db_path)
    found = dict(raw.execute("select id, used_at from api_keys"))
    raw.close()
    assert {found[key.id] for key in keys} == {to_text(minute)}


@pytest.mark.sqlite_only  # SQLite's create batches (keysvc.db.sqlite.createbatch)
async def test_a_batch_waits_for_another_processs_write_lock_off_the_loop(
    client: Client, admin: Creds
) -> None:
    """Another connection (another worker) holding the write lock makes the batch wait
    for it on the create thread, within the busy timeout; the loop keeps serving."""
    store = client.app[STORE]
    news = await new_keys(client, admin.organization_id, 3, prefix="waiting")
    other = sqlite3.connect(client.app[SETTINGS].db_path, isolation_level=None)
    other.execute("begin immediate")
    try:
        pending = asyncio.ensure_future(outcomes(store, news, 1000))
        started = time.monotonic()
        await asyncio.sleep(0.3)
        assert time.monotonic() - started < 1.0  # the loop was not held up meanwhile
        assert (await client.get("/healthz")).status == 200
        assert not pending.done()  # the batch is waiting for the lock
    finally:
        other.execute("rollback")
        other.close()
    made = await asyncio.wait_for(pending, timeout=10)
    names = [key.name for key in made if isinstance(key, Key)]
    assert names == ["waiting0", "waiting1", "waiting2"]


_STAGE = store_module._stage_batch


async def _fails_staging(conn: sqlite3.Connection, batch: Any, staged: Any) -> object:
    await _STAGE(conn, batch, staged)
    raise sqlite3.OperationalError("disk I/O error")


async def _fails_at_commit(conn: sqlite3.Connection, batch: Any, staged: Any) -> object:
    """The batch, plus a row that the commit refuses: the real commit fails."""
    conn.execute("pragma defer_foreign_keys = on")
    conn.execute("insert into key_roles (key_id, role_id) values ('no-such-key', 'no-such-role')")
    return await _STAGE(conn, batch, staged)


@pytest.mark.sqlite_only  # SQLite's create batches (keysvc.db.sqlite.createbatch)
@pytest.mark.parametrize(
    ("broken", "error"),
    [(_fails_staging, sqlite3.OperationalError), (_fails_at_commit, sqlite3.IntegrityError)],
)
async def test_a_batch_that_fails_answers_each_of_its_requests(
    client: Client,
    admin: Creds,
    monkeypatch: pytest.MonkeyPatch,
    broken: Callable[..., object],
    error: type[Exception],
) -> None:
    """A failure of the whole transaction (a busy or full disk, say), whether while
    its statements run or at its commit, is every waiting request's answer,
    promptly: none is left waiting, nothing of the batch is kept, and no
    transaction is left open for the next batch."""
    store = client.app[STORE]
    news = await new_keys(client, admin.organization_id, 3, prefix="failing")
    before = await store.list_keys(admin.organization_id, 0, 100)
    monkeypatch.setattr(store_module, "_stage_batch", broken)
    made = await asyncio.wait_for(outcomes(store, news, 1000), timeout=10)
    assert [type(result) for result in made] == [error] * 3
    monkeypatch.undo()
    conn = store._creates.thread._conn
    assert conn is not None and not conn.in_transaction
    after = await store.list_keys(admin.organization_id, 0, 100)
    assert after.total == before.total and after.keys == before.keys
    again = await outcomes(store, news, 1000)  # and the next batch is written as ever
    assert all(isinstance(key, Key) for key in again)


@pytest.mark.sqlite_only  # SQLite's create batches (keysvc.db.sqlite.createbatch)
async def test_a_batch_whose_flusher_is_cancelled_still_ends_before_the_next_begins(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled during its commit, a batch is still committed and answered, and
    the next batch waits for it rather than use the connection meanwhile."""
    store = client.app[STORE]
    first = await new_keys(client, admin.organization_id, 2, prefix="first")
    second = await new_keys(client, admin.organization_id, 2, prefix="second")
    commit = store_module._commit
    in_commit, release = threading.Event(), threading.Event()

    def held_commit(conn: sqlite3.Connection) -> None:
        in_commit.set()
        release.wait(10)  # until the next batch has been asked for
        commit(conn)

    monkeypatch.setattr(store_module, "_commit", held_commit)
    pending = asyncio.ensure_future(outcomes(store, first, 1000))
    while not in_commit.is_set():  # the first batch is in its commit now
        await asyncio.sleep(0.01)
    flusher = store._creates.flusher
    assert flusher is not None and not flusher.done()
    flusher.cancel()
    next_batch = asyncio.ensure_future(outcomes(store, second, 1000))
    await asyncio.sleep(0.05)  # the next batch's flusher is running, and must wait
    release.set()
    made = await asyncio.wait_for(next_batch, timeout=10)
    assert [key.name for key in made if isinstance(key, Key)] == ["second0", "second1"]
    earlier = await asyncio.wait_for(pending, timeout=10)
    assert [key.name for key in earlier if isinstance(key, Key)] == ["first0", "first1"]


async def test_a_rule_that_raises_refuses_its_own_create_alone(
    client: Client, admin: Creds
) -> None:
    """The domain's re-check runs inside the batch: should it raise rather than return
    its refusal, that create alone is refused with what it raised, and the batch's
    other creates are stored."""
    store = client.app[STORE]
    news = await new_keys(client, admin.organization_id, 4)
    broken = news[2]

    def recheck(new: NewKey, granted: Any) -> Exception | None:
        if new is broken:
            raise ValueError("the rule itself failed")
        return None

    results = await asyncio.gather(
        *(store.create_key(new, 1000, ANNOUNCE, recheck) for new in news), return_exceptions=True
    )
    assert [type(result).__name__ for result in results] == ["Key", "Key", "ValueError", "Key"]
    listed = await store.list_keys(admin.organization_id, 0, 100)
    assert [key.name for key in listed.keys] == ["acme admin", "k0", "k1", "k3"]
