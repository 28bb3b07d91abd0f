"""Revoke-by-secret reports kept in the database until acted on (``pending_leak_reports``,
``keysvc.domain.leaks.receive`` and ``PendingReports``), through the real app on both
backends: the report's row is written before its answer and its key disabled shortly
after, by the background task alone; a row another process left is acted on at the
next poll; seventeen keys on one secret are all disabled; past the bound every report,
hit or miss, gets the same 503 with Retry-After and nothing is written; the table holds
the secret's keyed hash, never the secret (SQLite's file, a PostgreSQL dump)."""

import asyncio
import hashlib
import time
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.credentials import new_secret
from keysvc.domain.leaks import BUSY, BUSY_RETRY_AFTER, MAX_PENDING
from keysvc.http.state import HASHER, LEAK_REPORTS
from tests.handsql import everything_stored, hand_sql, hand_transaction, hand_value
from tests.helpers import Client, Creds, assert_error, create, create_creds, get_key, hash_data
from tests.postgres import Postgres

REVOKE = "/v1/keys/revoke-leaked"
PENDING = "select secret_hash, actor_type, actor_details, action from pending_leak_reports"
# What a killed process leaves: a report's row, written by hand here.
LEFT = """
    insert into pending_leak_reports (secret_hash, actor_type, actor_details, action, reported_at)
    values (?, 'system', 'revoke-leaked', 'disable', '2026-01-01T00:00:00.000000Z')
"""
# MAX_PENDING rows at once, whose hash no key has.
FILL = """
    with recursive n(i) as (select 1 union all select i + 1 from n where i < ?)
    insert into pending_leak_reports (secret_hash, actor_type, action, reported_at)
    select ?, 'system', 'disable', '2026-01-01T00:00:00.000000Z' from n
"""


async def _hand(settings: Settings, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """SQL by hand, on a thread: the app's own writes (the background task's, usage
    counts) must not wait behind an event loop blocked on the database's lock."""
    return await asyncio.to_thread(hand_sql, settings, sql, *params)


async def _hand_value(settings: Settings, sql: str) -> Any:
    return await asyncio.to_thread(hand_value, settings, sql)


# A key whose state no update may change, by hand: its report's work fails.
HOLD = {
    "sqlite": [
        "create trigger test_hold before update of state on api_keys when old.name = 'held'"
        " begin select raise(abort, 'held by the test'); end"
    ],
    "postgres": [
        "create function test_hold() returns trigger language plpgsql as"
        " $$ begin raise exception 'held by the test'; end $$",
        "create trigger test_hold before update on api_keys for each row"
        " when (old.name = 'held') execute function test_hold()",
    ],
}
RELEASE = {"sqlite": "drop trigger test_hold", "postgres": "drop trigger test_hold on api_keys"}


async def _report(client: Client, secret: str) -> None:
    response = await client.post(REVOKE, json={"secret": secret})
    assert response.status == 200, await response.text()
    assert (await response.json())["result"] == {"status": "received"}


async def _state(client: Client, admin: Creds, key_id: str) -> str:
    state: str = (await get_key(client, admin, key_id))["state"]
    return state


async def _disabled_within(client: Client, admin: Creds, key_id: str, seconds: float) -> float:
    """How long until the key is disabled, by the background task alone."""
    started = time.monotonic()
    while await _state(client, admin, key_id) != "disabled":
        assert time.monotonic() - started < seconds, "the key is still enabled"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_the_report_is_written_before_its_answer_and_acted_on_after(
    client: Client, admin: Creds, settings: Settings
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    key_id = made.id
    tasks = client.app[LEAK_REPORTS]
    await tasks.close()  # the answer alone: nothing acts on the row yet
    await _report(client, "  " + made.secret + "\n")
    rows = await _hand(settings, PENDING)
    keyed = client.app[HASHER].of_plain(made.secret)
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows] == [
        (keyed, "system", "revoke-leaked", "disable")
    ]
    assert keyed != hashlib.sha256(made.secret.encode()).digest()
    assert await _state(client, admin, key_id) == "enabled"
    tasks.start()  # as the next start does: the row is found by the first round
    assert await _disabled_within(client, admin, key_id, 3) < 3
    assert await _hand(settings, PENDING) == []


async def test_a_report_is_acted_on_within_a_second_of_its_answer(
    client: Client, admin: Creds, settings: Settings
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await _report(client, made.secret)
    assert await _disabled_within(client, admin, made.id, 1) < 1
    await _report(client, new_secret())  # a miss: its row goes too
    started = time.monotonic()
    while await _hand(settings, PENDING):
        assert time.monotonic() - started < 1
        await asyncio.sleep(0.01)


async def test_a_row_another_process_left_is_acted_on_at_the_next_poll(
    client: Client, admin: Creds, settings: Settings
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await _hand(settings, LEFT, client.app[HASHER].of_plain(made.secret))
    assert await _disabled_within(client, admin, made.id, 3) < 3
    assert await _hand(settings, PENDING) == []


async def test_seventeen_keys_on_one_secret_are_all_disabled(
    client: Client, admin: Creds, settings: Settings
) -> None:
    secret = new_secret()
    ids = []
    for n in range(17):
        body = {
            "name": f"k{n}",
            "roles": ["developer"],
            "hashData": hash_data(f"own-key-{n:04d}", secret),
        }
        ids.append((await create(client, admin, body))["key"]["id"])
    await _report(client, secret)
    await client.app[LEAK_REPORTS].work_through()
    assert [await _state(client, admin, key_id) for key_id in ids] == ["disabled"] * 17
    assert await _hand(settings, PENDING) == []
    leaked = "select count(*) from activities where type = 'key_leaked'"
    assert await _hand_value(settings, leaked) == 17


def _alike(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in ("x-request-id", "date")}


async def test_past_the_bound_a_hit_and_a_miss_get_the_same_503(
    client: Client, admin: Creds, settings: Settings
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await client.app[LEAK_REPORTS].close()  # the rows stay while the reports come
    await _hand(settings, FILL, MAX_PENDING, b"\0" * 32)
    answers = []
    for secret in (made.secret, new_secret()):
        response = await client.post(REVOKE, json={"secret": secret})
        body = await assert_error(response, 503, BUSY)
        assert response.headers["Retry-After"] == str(BUSY_RETRY_AFTER)
        del body["requestId"]
        answers.append((response.status, body, _alike(response.headers)))
    assert answers[0] == answers[1]
    assert await _hand_value(settings, "select count(*) from pending_leak_reports") == MAX_PENDING
    assert await _state(client, admin, made.id) == "enabled"


async def test_the_table_never_holds_the_secret(
    client: Client, admin: Creds, settings: Settings, request: pytest.FixtureRequest
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await client.app[LEAK_REPORTS].close()
    await _report(client, made.secret)
    assert await _hand_value(settings, "select count(*) from pending_leak_reports") == 1
    assert made.secret.encode() not in await asyncio.to_thread(everything_stored, settings)
    if settings.db_url is not None:
        cluster: Postgres = request.getfixturevalue("postgres")
        dump = cluster.run("pg_dump", "--data-only", settings.db_url)
        assert "pending_leak_reports" in dump
        assert made.secret not in dump
        assert hashlib.sha256(made.secret.encode()).hexdigest() not in dump


async def test_a_report_whose_work_fails_holds_up_none_after_it(
    client: Client, admin: Creds, settings: Settings, backend: str
) -> None:
    held = await create_creds(client, admin, {"name": "held", "roles": ["developer"]})
    after = await create_creds(client, admin, {"name": "after", "roles": ["developer"]})
    tasks = client.app[LEAK_REPORTS]
    await tasks.close()
    await asyncio.to_thread(hand_transaction, settings, *((sql, ()) for sql in HOLD[backend]))
    await _report(client, held.secret)
    await _report(client, after.secret)
    await tasks.work_through()
    assert await _state(client, admin, after.id) == "disabled"
    assert await _state(client, admin, held.id) == "enabled"
    assert await _hand_value(settings, "select count(*) from pending_leak_reports") == 1
    await _hand(settings, RELEASE[backend])
    await tasks.work_through()  # the next round
    assert await _state(client, admin, held.id) == "disabled"
    assert await _hand(settings, PENDING) == []
