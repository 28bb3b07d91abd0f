"""What a role that may log in to some other database of the PostgreSQL server can do
to keysvc through the NOTIFY queue, one per cluster (8 GB): LISTEN and hold a
transaction open in one session, fill the queue with pg_notify from another. Two
real `keysvc serve` instances on a real cluster of this module's own, on disk (the
queue's files reach 8 GB; /dev/shm is the other tests' and has not the room),
removed after.

keysvc's commits do not depend on the queue (keysvc.db.postgres.schema's QUIET; the
announcement is sent after the commit): with the queue full, create, disable,
delete, revoke-leaked and a sign-in that touches usedAt all succeed, `/readyz` says
ready, and a disable returns once the other instance refuses the key (its probe reads
the generation; its caches are off while the queue is full), within
ACKNOWLEDGE_SECONDS."""

import asyncio
import json
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from keysvc.db.postgres.notifications import ACKNOWLEDGE_SECONDS, DEAF_USAGE
from keysvc.domain.leaks import POLL_SECONDS
from tests import pginstances
from tests.pgfaults import module_cluster
from tests.pginstances import (
    SLACK_SECONDS,
    WAIT_SECONDS,
    Client,
    cached_on_both,
    changed,
    lines_with,
    made_on,
    org_path,
    timed_change,
)
from tests.postgres import Postgres

pytestmark = pytest.mark.slow

# On disk, not in the temporary folder the suite may put in memory.
ON_DISK = Path("/var/tmp")
# 8,000 bytes is NOTIFY's largest payload; each distinct, as a transaction folds
# duplicates into one.
FILL = "select pg_notify('jam', n::text || repeat('x', 7900)) from generate_series(1, $1) n"
# Rows per transaction: large ones to fill fast, then smaller ones into what is left.
FILL_ROWS = (50_000, 1_000, 1)
FULL = "too many notifications in the NOTIFY queue"

admin = pginstances.admin
two = pginstances.two


postgres = module_cluster(ON_DISK)


@pytest.fixture
def jammer(postgres: Postgres, pg_database: str) -> Iterator[str]:
    """A role that may log in, and nothing more, LISTENing in the ``postgres`` database
    with a transaction held open; CONNECT on keysvc's database revoked from everyone,
    which does not help. Its URL to ``postgres``; its session ends after the test."""
    role = f"jammer_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {role} login nosuperuser nocreatedb nocreaterole")
    postgres.psql("postgres", f"revoke connect on database {pg_database} from public")
    listener = subprocess.Popen(
        postgres.command(
            "psql", "--host=127.0.0.1", f"--port={postgres.port}", f"--username={role}",
            "--dbname=postgres", "--no-psqlrc", "--quiet",
        ),
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert listener.stdin is not None
    listener.stdin.write("listen jam;\nbegin;\nselect 1;\n")
    listener.stdin.flush()
    held = f"select 1 from pg_stat_activity where usename = '{role}'"
    held += " and state = 'idle in transaction'"
    deadline = time.monotonic() + WAIT_SECONDS
    try:
        while not postgres.psql("postgres", held):
            assert listener.poll() is None and time.monotonic() < deadline, "no transaction"
            time.sleep(0.05)
        yield f"postgresql://{role}@127.0.0.1:{postgres.port}/postgres"
    finally:
        listener.stdin.close()
        listener.wait(timeout=WAIT_SECONDS)


async def _fill(url: str) -> None:
    """pg_notify until not even one more notification fits."""
    conn = await asyncpg.connect(url)
    try:
        for rows in FILL_ROWS:
            while True:
                try:
                    await conn.execute(FILL, rows)
                except asyncpg.PostgresError as exc:
                    assert FULL in str(exc), exc
                    break
    finally:
        await conn.close()


def _revoke_leaked(client: Client, secret: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{client.server.port}/v1/keys/revoke-leaked",
        data=json.dumps({"secret": secret}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as response:
        status: int = response.status
    return status


def _ready(client: Client) -> int:
    url = f"http://127.0.0.1:{client.server.port}/readyz"
    with urllib.request.urlopen(url, timeout=WAIT_SECONDS) as response:
        status: int = response.status
    return status


def test_a_full_notify_queue_refuses_no_write_and_revocation_keeps_its_bound(
    postgres: Postgres,
    pg_database: str,
    two: tuple[Client, Client],
    admin: dict[str, str],
    jammer: str,
) -> None:
    key, creds = cached_on_both(two, admin)
    asyncio.run(_fill(jammer))
    # New connections: the kept-alive ones have been idle past the servers' keep-alive.
    a, b = fresh = [Client(client.server) for client in two]
    try:
        _full_queue_checks(postgres, admin, a, b, key, creds)
    finally:
        for client in fresh:
            client.close()


def _full_queue_checks(
    postgres: Postgres, admin: dict[str, str], a: Client, b: Client, key: str,
    creds: dict[str, str],
) -> None:  # fmt: skip
    ((usage,),) = postgres.psql("postgres", "select pg_notification_queue_usage()")
    assert float(usage) > 0.99, usage
    # Every instance has found the queue full and turned its caches off.
    for client in (a, b):
        lines_with(client.server, "NOTIFY queue is")
    # A revocation: answered once the other instance refuses the key.
    took = timed_change(a, admin, key, "disabled")
    assert took < ACKNOWLEDGE_SECONDS + SLACK_SECONDS, took
    assert b.whoami(creds) == 401
    # A create, and its first sign-in on the other instance (a usedAt touch is due).
    other, other_creds = made_on(b, admin, {"name": "made while full", "roles": ["developer"]})
    assert a.whoami(other_creds) == 200
    assert _revoke_leaked(b, other_creds["keySecret"]) == 200
    # The report is acted on in the background (keysvc.domain.leaks.PendingReports), its
    # disable then waits for the other instances as any revocation does.
    deadline = time.monotonic() + POLL_SECONDS + ACKNOWLEDGE_SECONDS + SLACK_SECONDS
    while a.whoami(other_creds) != 401:
        assert time.monotonic() < deadline, "the leaked key still passes on the other instance"
        time.sleep(0.1)
    changed(a, admin, "DELETE", f"/keys/{other}", None)
    status, _ = b.request("GET", org_path(admin, f"/keys/{other}"), admin)
    assert status == 404
    assert _ready(a) == 200 and _ready(b) == 200
    ((usage,),) = postgres.psql("postgres", "select pg_notification_queue_usage()")
    assert float(usage) > DEAF_USAGE, usage
