"""The data layer's SQL functions on both backends: the same calls, on a SQLite
connection and on a PostgreSQL one (keysvc.db.postgres.connection, a real server from
tests/postgres.py), give the same answers. Each statement whose PostgreSQL form
differs (keysvc.db.dialect) is run here on both."""

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db import meta, outbox
from keysvc.db import roles as role_sql
from keysvc.db import usage as usage_sql
from keysvc.db import webhooks as webhook_sql
from keysvc.db.postgres.connection import connect_postgres
from keysvc.db.quota import UNLIMITED
from keysvc.db.rows import key_from_joined
from keysvc.db.seal import Seal
from keysvc.db.sqlite.connections import connect
from keysvc.db.sqlite.migrations import migrate
from keysvc.db.statements import settle, tentatively
from keysvc.errors import Conflict
from keysvc.models import Activity, Actor, KeyChange, NewKey, Organization, Role
from keysvc.timeutil import to_text
from tests.postgres import Postgres

ORG = "00000000-0000-4000-8000-000000000001"
ADMIN = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
DEVELOPER = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
async def conn(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        made: Any = await connect(tmp_path / "keysvc.db", create=True)
        await migrate(made)
    else:
        postgres: Postgres = request.getfixturevalue("postgres")
        made = await connect_postgres(postgres.url(request.getfixturevalue("pg_database")))
    await meta.insert_organization(made, Organization(ORG, "acme", NOW))
    yield made
    await made.close()


def new_key(
    name: str, key_id_hash: bytes, *roles: str, expire_at: datetime | None = None
) -> NewKey:
    return NewKey(
        organization_id=ORG,
        name=name,
        state="enabled",
        key_id_hash=key_id_hash,
        secret_hash=b"s" * 32,
        key_suffix="abcd",
        created_at=NOW,
        expire_at=expire_at,
        ip_access_list=[{"source": "10.0.0.0/8", "description": "office"}],
        role_ids=roles,
        rate_limit=(10, 60),
    )


async def test_keys(conn: Any) -> None:
    first = await key_sql.insert_key(conn, new_key("first", b"a" * 32, ADMIN))
    second = await key_sql.insert_key(
        conn, new_key("second", b"b" * 32, DEVELOPER, ADMIN, expire_at=NOW)
    )
    assert (first.org_seq, second.org_seq) == (1, 2)
    assert [role.name for role in second.roles] == ["admin", "developer"]
    assert first.rate_limit == (10, 60)
    assert await key_sql.get_key(conn, ORG, first.id) == first
    assert await key_sql.get_key(conn, "another", first.id) is None

    keys, more, total, identities = await key_sql.list_page(conn, ORG, 0, 1)
    assert (keys, more, total, identities) == ([first], True, 2, {})
    keys, more, total, identities = await key_sql.list_page(conn, ORG, 1, 5)
    assert (keys, more, total, identities) == ([second], False, 2, {})

    with pytest.raises(Conflict, match="already exists"):
        await key_sql.insert_key(conn, new_key("taken", b"a" * 32))
    with pytest.raises(Conflict, match="role was deleted"):
        await key_sql.insert_key_roles(conn, first.id, ["no-such-role"])

    await key_sql.update_key(conn, first, KeyChange(state="disabled", role_ids=[DEVELOPER]))
    changed = await key_sql.get_key(conn, ORG, first.id)
    assert changed is not None and changed.state == "disabled"
    assert [role.name for role in changed.roles] == ["developer"]

    await key_sql.rotate_key(conn, first.id, b"c" * 32, b"t" * 32, "wxyz", NOW, NOW)
    assert await key_sql.key_id_in_use(conn, b"a" * 32)  # the previous key ID
    assert await key_sql.key_id_in_use(conn, b"c" * 32)
    assert not await key_sql.key_id_in_use(conn, b"d" * 32)
    rows = await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"a" * 32))
    assert [(row["id"], bytes(row["credential_secret_hash"])) for row in rows] == [
        (first.id, b"s" * 32)
    ]

    changed_again = await key_sql.get_key(conn, ORG, first.id)
    await key_sql.write_used_at(conn, {second.id: "2026-03-04T05:06:00Z"})
    await key_sql.write_used_at(conn, {second.id: "2026-03-04T05:05:00Z"})  # never back
    used = await key_sql.get_key(conn, ORG, second.id)
    assert used is not None and used.used_at == datetime(2026, 3, 4, 5, 6, tzinfo=UTC)

    joined = await conn.execute_fetchall(key_sql.KEY_BY_ID_JOINED, (second.id, ORG))
    assert key_from_joined(joined) == used
    joined = await conn.execute_fetchall(
        key_sql.CREDENTIAL_JOINED, key_sql.credential_params(b"c" * 32)
    )
    assert key_from_joined(joined) == changed_again
    states = await conn.execute_fetchall(key_sql.COUNT_KEYS_BY_STATE, (to_text(NOW),))
    assert {row["effective"]: row["n"] for row in states} == {"disabled": 1, "expired": 1}

    assert await key_sql.delete_key(conn, ORG, second.id)
    assert not await key_sql.delete_key(conn, ORG, second.id)
    assert await meta.organization_ids(conn) == [ORG]


async def test_a_deleted_keys_tombstone(conn: Any) -> None:
    """The trigger keeps a deleted key's credentials, and its rotation's previous ones
    while their grace runs; CREDENTIAL reads them last; the upkeep prunes them."""
    now = datetime.now(UTC)
    key = await key_sql.insert_key(conn, new_key("k", b"a" * 32))
    await key_sql.rotate_key(
        conn, key.id, b"c" * 32, b"t" * 32, "wxyz", now + timedelta(hours=1), now
    )
    ended = await key_sql.insert_key(conn, new_key("ended", b"e" * 32))
    await key_sql.rotate_key(conn, ended.id, b"f" * 32, b"u" * 32, "wxyz", NOW, NOW)
    assert await key_sql.delete_key(conn, ORG, key.id)
    assert await key_sql.delete_key(conn, ORG, ended.id)

    def tombstone(rows: list[Any]) -> tuple[str, bytes, int]:
        (row,) = rows
        return row["id"], bytes(row["credential_secret_hash"]), row["previous"]

    for key_id_hash, secret_hash in ((b"c" * 32, b"t" * 32), (b"a" * 32, b"s" * 32)):
        rows = await conn.execute_fetchall(
            key_sql.CREDENTIAL, key_sql.credential_params(key_id_hash)
        )
        assert tombstone(rows) == (key.id, secret_hash, 2)
    assert tombstone(
        await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"f" * 32))
    ) == (ended.id, b"u" * 32, 2)
    # The ended grace's previous key ID is not kept.
    assert not await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"e" * 32))

    await key_sql.prune_tombstones(conn, now - timedelta(days=1))
    assert await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"c" * 32))
    await key_sql.prune_tombstones(conn, now + timedelta(days=1))
    assert not await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"c" * 32))


async def test_ended_previous_credentials_are_dropped(conn: Any) -> None:
    ending = await key_sql.insert_key(conn, new_key("ending", b"a" * 32))
    running = await key_sql.insert_key(conn, new_key("running", b"b" * 32))
    await key_sql.rotate_key(conn, ending.id, b"c" * 32, b"t" * 32, "wxyz", NOW, NOW)
    await key_sql.rotate_key(
        conn, running.id, b"d" * 32, b"t" * 32, "wxyz", NOW + timedelta(hours=1), NOW
    )
    await key_sql.drop_ended_previous(conn, NOW)
    assert not await key_sql.key_id_in_use(conn, b"a" * 32)
    assert await key_sql.key_id_in_use(conn, b"b" * 32)
    # The ended pair is kept as a rotated key's tombstone; the running one is not.
    (kept,) = await conn.execute_fetchall(key_sql.CREDENTIAL, key_sql.credential_params(b"a" * 32))
    assert kept["previous"] == 3 and kept["id"] == ending.id
    (running_row,) = await conn.execute_fetchall(
        key_sql.CREDENTIAL, key_sql.credential_params(b"b" * 32)
    )
    assert running_row["previous"] == 1


async def test_a_tentative_write_is_undone_or_kept(conn: Any) -> None:
    for keep in (False, True):
        await conn.execute("begin")
        await tentatively(conn)
        await key_sql.insert_key(conn, new_key(f"k{keep}", b"a" * 32))
        await settle(conn, keep)
        await conn.execute("commit")
        assert await key_sql.key_id_in_use(conn, b"a" * 32) == keep


async def test_roles(conn: Any) -> None:
    key = await key_sql.insert_key(conn, new_key("k", b"a" * 32, DEVELOPER))
    other = await key_sql.insert_key(conn, new_key("o", b"b" * 32, DEVELOPER, ADMIN))
    custom = Role(
        "00000000-0000-4000-8000-0000000000aa", "auditor", "custom", ("x:read",), NOW, NOW
    )
    await role_sql.insert_role(conn, ORG, custom)
    store = role_sql.RoleStore(conn, None)
    page = await store.list_roles(ORG, (-1, ""), 10)
    assert [detail.role.name for detail in page.roles] == [
        "admin",
        "developer",
        "query_endpoints",
        "auditor",
    ]
    later = await store.list_roles(ORG, (0, "developer"), 10)
    assert [detail.role.name for detail in later.roles] == ["query_endpoints", "auditor"]
    resolved = await store.resolve_roles(ORG, ["admin"], [custom.id])
    assert sorted(role.name for role in resolved) == ["admin", "auditor"]

    await role_sql.set_actors(conn, custom.id, [key.id, other.id])
    await role_sql.set_actors(conn, custom.id, [key.id, other.id])  # already held: ignored
    assert await role_sql.count_holders(conn, custom.id) == 2
    assert await role_sql.keys_in_organization(conn, ORG, [key.id, "nope"]) == {key.id}
    assert await role_sql.key_with_roles_besides(conn, [key.id, other.id], custom.id, 2) == (
        other.id
    )
    assert await role_sql.stranded_key(conn, DEVELOPER, [other.id]) is None
    await role_sql.set_actors(conn, DEVELOPER, [other.id])
    assert await role_sql.permissions_of_keys(conn, ORG, [key.id]) == {"x:read"}
    assert await role_sql.stranded_key(conn, custom.id, []) == key.id


async def test_usage(conn: Any) -> None:
    key = await key_sql.insert_key(conn, new_key("k", b"a" * 32))
    minute = NOW.replace(second=0)
    counts = {(key.id, minute): [1, 0, 0, 0, 0, 2], ("gone", minute): [5, 0, 0, 0, 0, 0]}
    await usage_sql.add_counts(conn, counts)
    await usage_sql.add_counts(conn, {(key.id, minute): [3, 1, 0, 0, 0, 0]})
    series = await usage_sql.series(conn, key.id, minute, minute + timedelta(hours=1), 13)
    assert dict(series) == {"2026-03-04T05": [4, 1, 0, 0, 0, 2]}
    await usage_sql.prune(conn, minute + timedelta(minutes=1))
    assert await usage_sql.series(conn, key.id, minute, minute + timedelta(hours=1), 13) == {}


async def test_activities(conn: Any) -> None:
    chain = activity_sql.Chain(b"k" * 32)
    actor = Actor("system", details="test")
    made = [
        Activity(ORG, "openapi_key_create", actor, NOW + timedelta(minutes=n), after={"n": n})
        for n in range(3)
    ]
    await activity_sql.record(conn, chain, *made)
    page = await activity_sql.page(conn, ORG, 0, 2, None, None)
    assert ([a.after for a in page.activities], page.more, page.total) == (
        [{"n": 0}, {"n": 1}],
        True,
        3,
    )
    since = await activity_sql.page(conn, ORG, 0, 10, NOW + timedelta(minutes=1), None)
    assert ([a.org_seq for a in since.activities], since.total) == ([2, 3], 2)
    found = await activity_sql.get(conn, ORG, made[1].id)
    assert found is not None and found.org_seq == 2 and found.actor == actor


async def test_webhooks_and_their_outbox(conn: Any) -> None:
    hook = await webhook_sql.insert_webhook(
        conn, "w1", ORG, "https://example.com/h", ("key.created", "key.expiring"), 7, b"n", NOW
    )
    assert await webhook_sql.list_webhooks(conn, ORG) == [hook]
    seal = Seal(b"k" * 32)
    await outbox.enqueue(conn, seal, UNLIMITED, ORG, "key.created", {"id": "k"}, NOW)
    await outbox.enqueue(
        conn, seal, UNLIMITED, ORG, "key.deleted", {"id": "k"}, NOW
    )  # not subscribed
    at = NOW.timestamp()
    assert await outbox.any_due(conn, at, 2)
    (due,) = await outbox.claim(conn, at, at + 30, "me", 10, 2)
    assert json.loads(due.body)["type"] == "key.created" and seal.verifies(due)
    assert not await outbox.any_due(conn, at, 2)  # leased
    await outbox.record(conn, due, "me", NOW, 500, None, "pending", at + 60)
    deliveries, more, total = await webhook_sql.delivery_page(conn, "w1", None, 10)
    assert (len(deliveries), more, total) == (1, False, 1)
    assert [(a.status, a.error) for a in deliveries[0].attempts] == [(500, None)]

    soon = await key_sql.insert_key(
        conn, new_key("soon", b"a" * 32, expire_at=NOW + timedelta(days=3))
    )
    await key_sql.insert_key(conn, new_key("later", b"b" * 32, expire_at=NOW + timedelta(days=30)))
    (warn,) = await outbox.expiring(conn, NOW, 10)
    assert (warn.webhook_id, warn.key_id) == ("w1", soon.id)
    assert await outbox.warned(conn, "w1", soon.id, warn.expire_at)
    assert not await outbox.warned(conn, "w1", soon.id, warn.expire_at)
    assert await outbox.expiring(conn, NOW, 10) == []
    assert await webhook_sql.delete_webhook(conn, ORG, "w1")
    assert not await webhook_sql.delete_webhook(conn, ORG, "w1")


SEAL = Seal(b"k" * 32)


async def test_the_outbox_is_claimed_fairly(conn: Any) -> None:
    """A webhook has one attempt under way at a time, an organization at most its
    share, and the heads go round the organizations, the one with fewest under way
    first, then the oldest; a lease run out is taken again."""
    other = "00000000-0000-4000-8000-000000000002"
    await meta.insert_organization(conn, Organization(other, "other", NOW))
    for org, name in [(ORG, "a0"), (ORG, "a1"), (ORG, "a2"), (other, "b0")]:
        url = f"https://example.com/{name}"
        await webhook_sql.insert_webhook(
            conn, name, org, url, ("key.created",), 7, name.encode(), NOW
        )
    for n in range(2):
        await outbox.enqueue(
            conn, SEAL, UNLIMITED, ORG, "key.created", {"n": n}, NOW + timedelta(seconds=n)
        )
    await outbox.enqueue(
        conn, SEAL, UNLIMITED, other, "key.created", {"n": 9}, NOW + timedelta(seconds=5)
    )

    def made(claimed: list[outbox.Due]) -> list[tuple[str, int]]:
        return [(due.url.rsplit("/", 1)[1], json.loads(due.body)["data"]["n"]) for due in claimed]

    at = (NOW + timedelta(minutes=1)).timestamp()
    first = await outbox.claim(conn, at, at + 30, "me", 10, 2)
    assert made(first) == [("a0", 0), ("b0", 9), ("a1", 0)]
    assert not await outbox.any_due(conn, at, 2)  # a2: its organization holds 2
    await outbox.record(conn, first[0], "me", NOW, 204, None, "delivered", None)
    assert made(await outbox.claim(conn, at, at + 30, "me", 10, 2)) == [("a2", 0)]
    assert not await outbox.any_due(conn, at, 2)
    later = at + 31  # every lease has run out
    assert made(await outbox.claim(conn, later, later + 30, "me", 10, 2)) == [
        ("a1", 0), ("b0", 9), ("a2", 0),
    ]  # fmt: skip


async def test_an_empty_delivery_log(conn: Any) -> None:
    await webhook_sql.insert_webhook(
        conn, "w1", ORG, "https://example.com/h", ("key.created",), 7, b"n", NOW
    )
    assert await webhook_sql.delivery_page(conn, "w1", None, 10) == ([], False, 0)
