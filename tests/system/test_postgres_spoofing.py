"""What a database role with only CONNECT (PUBLIC's default) can do to keysvc instances
sharing a PostgreSQL database through the channels they talk on
(keysvc.db.postgres.notifications.Notifications): LISTEN and NOTIFY need no other privilege, and
pg_stat_activity shows every session's application_name. Each test is one attack of
issue 31, made by a real second role against real `keysvc serve` processes:

- a spoofed generation on keysvc_auth must not make a later real change look like
  nothing to an instance;
- a forged acknowledgement on keysvc_seen must not let a writer return before a
  silent instance's bound, and is logged once;
- connections named as listening instances must not hold writers up."""

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from keysvc.db.postgres.notifications import (
    ACKNOWLEDGE_SECONDS,
    AUTH_CHANNEL,
    LISTENER_PREFIX,
    SEEN_CHANNEL,
)
from tests import pginstances
from tests.pginstances import (
    SLACK_SECONDS,
    WAIT_SECONDS,
    Client,
    cached_on_both,
    lines_with,
    listening,
    made_on,
    timed_change,
)
from tests.postgres import Postgres
from tests.server import Server

BOUND = ACKNOWLEDGE_SECONDS


admin = pginstances.admin
two = pginstances.two


@pytest.fixture
def intruder_url(postgres: Postgres, pg_database: str) -> str:
    """A URL of the test's database for a new role that may log in and nothing more:
    the database's CONNECT it has from PUBLIC, no table, no schema of keysvc's."""
    role = f"intruder_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {role} login nosuperuser nocreatedb nocreaterole")
    rows = postgres.psql(
        pg_database,
        f"select has_table_privilege('{role}', 'meta', 'select'),"
        f" has_database_privilege('{role}', current_database(), 'connect')",
    )
    assert rows == [["f", "t"]], rows
    return f"postgresql://{role}@127.0.0.1:{postgres.port}/{pg_database}"


@pytest.fixture
async def intruder(intruder_url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(intruder_url)
    try:
        yield conn
    finally:
        await conn.close()


async def heard(conn: Any, channel: str) -> "asyncio.Queue[str]":
    """The payloads ``conn`` hears on ``channel`` from now on."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener(channel, lambda _c, _p, _ch, payload: queue.put_nowait(payload))
    return queue


async def in_thread(call: Any, *args: Any) -> Any:
    """A blocking HTTP call, off the loop that serves the intruder's connection."""
    return await asyncio.to_thread(call, *args)


async def latest(generations: "asyncio.Queue[str]") -> int:
    """The newest generation heard, once no more arrive for a moment."""
    newest = int(await asyncio.wait_for(generations.get(), WAIT_SECONDS))
    while True:
        try:
            newest = max(newest, int(await asyncio.wait_for(generations.get(), 0.5)))
        except TimeoutError:
            return newest


async def test_a_spoofed_generation_does_not_hide_a_later_disable(
    two: tuple[Client, Client], admin: dict[str, str], intruder: Any
) -> None:
    a, b = two
    key, creds = await in_thread(cached_on_both, two, admin)
    other, _ = await in_thread(made_on, a, admin, {"name": "other", "roles": ["developer"]})
    generations = await heard(intruder, AUTH_CHANNEL)
    await in_thread(timed_change, a, admin, other, "disabled")
    current = await latest(generations)
    # A change of a key's state moves the generation twice (the domain's bump and the
    # table's trigger): announce the number the disable below ends at, before it.
    await intruder.execute(f"notify {AUTH_CHANNEL}, '{current + 2}'")
    await asyncio.sleep(0.5)  # heard by b, whatever it makes of it
    assert await in_thread(b.whoami, creds) == 200  # cached on b again
    await in_thread(timed_change, a, admin, key, "disabled")
    assert await in_thread(b.whoami, creds) == 401  # the very next request
    assert await latest(generations) == current + 2  # the number announced before
    assert await in_thread(b.whoami, creds) == 401
    status, _ = await in_thread(b.request, "GET", "/v1/verify", creds)
    assert status == 401
    # And the generation goes on moving as before.
    await in_thread(timed_change, a, admin, key, "enabled")
    assert await in_thread(b.whoami, creds) == 200


def instances_listening(postgres: Postgres, database: str, server: Server) -> list[str]:
    """The instance names ``server``'s listening connection shows in pg_stat_activity,
    as any role may read them."""
    names = listening(postgres, database, server, "application_name")
    return [name.removeprefix(LISTENER_PREFIX) for name in names]


async def test_a_forged_acknowledgement_does_not_release_a_writer_early(
    postgres: Postgres,
    pg_database: str,
    two: tuple[Client, Client],
    admin: dict[str, str],
    intruder: Any,
) -> None:
    a, b = two
    key, _ = await in_thread(cached_on_both, two, admin)
    (instance,) = instances_listening(postgres, pg_database, b.server)
    os.kill(b.server.proc.pid, signal.SIGSTOP)
    try:
        for forged in (f"{instance}:999999999", f"{instance}:999999999:{'0' * 64}"):
            await intruder.execute(f"notify {SEEN_CHANNEL}, '{forged}'")
        took = await in_thread(timed_change, a, admin, key, "disabled")
        assert BOUND - 0.1 < took < BOUND + SLACK_SECONDS, took
        await intruder.execute(f"notify {SEEN_CHANNEL}, '{instance}:999999999:zz'")
        took = await in_thread(timed_change, a, admin, key, "enabled")
        assert BOUND - 0.1 < took < BOUND + SLACK_SECONDS, took
    finally:
        os.kill(b.server.proc.pid, signal.SIGCONT)
    (warned,) = await in_thread(lines_with, a.server, "acknowledgement keysvc did not sign")
    assert json.loads(warned)["level"] == "warning", warned


async def test_connections_named_as_listeners_do_not_hold_writers_up(
    two: tuple[Client, Client], admin: dict[str, str], intruder_url: str
) -> None:
    a, b = two
    key, creds = await in_thread(cached_on_both, two, admin)
    fakes = [
        await asyncpg.connect(
            intruder_url, server_settings={"application_name": f"{LISTENER_PREFIX}fake.{n}"}
        )
        for n in range(3)
    ]
    try:
        # Nor can such a role register one: the table is keysvc's role's alone.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await fakes[0].execute(
                "insert into listeners (instance, pid, backend_start)"
                " select 'fake', pid, backend_start from pg_stat_activity"
                " where pid = pg_backend_pid()"
            )
        for state, answer in (("disabled", 401), ("enabled", 200)):
            took = await in_thread(timed_change, a, admin, key, state)
            assert took < 1.0, took
            assert await in_thread(b.whoami, creds) == answer
    finally:
        for fake in fakes:
            await fake.close()
