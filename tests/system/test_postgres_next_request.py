"""Two real `keysvc serve` processes on one PostgreSQL database (tests/postgres.py):
a change that moves the authorization generation, made through one instance, is
answered by the other from the very next request, with no tolerance; and a second
instance whose listening connection is stuck holds the writer up no longer than the
bound (keysvc.db.postgres.notifications.Notifications.seen_everywhere).

The requests go over kept-alive connections, so that the next one reaches the other
instance as soon as the client has read the writer's answer: the narrowest window a
client can make."""

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest

from keysvc.db.postgres.notifications import ACKNOWLEDGE_SECONDS, LISTENER_PREFIX
from tests import pginstances
from tests.pginstances import (
    SLACK_SECONDS,
    WAIT_SECONDS,
    Client,
    cached_on_both,
    changed,
    lines_with,
    listening,
    made_on,
    made_role,
    org_path,
    timed_change,
)
from tests.postgres import Postgres
from tests.server import Server

ITERATIONS = 100
admin = pginstances.admin
two = pginstances.two


def listener_pid(postgres: Postgres, database: str, server: Server) -> int:
    """The server process of ``server``'s listening connection (named after its pid)."""
    (pid,) = [int(value) for value in listening(postgres, database, server, "pid")]
    return pid


def test_disabled_on_one_is_refused_by_the_other_on_the_very_next_request(
    two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = two
    key, creds = made_on(a, admin, {"name": "next", "roles": ["developer"]})
    path = f"/keys/{key}"
    missed: list[tuple[int, str, int]] = []
    for iteration in range(ITERATIONS):
        changed(a, admin, "PATCH", path, {"state": "enabled"})
        if (status := b.whoami(creds)) != 200:  # and b holds it in memory again
            missed.append((iteration, "enabled", status))
        changed(a, admin, "PATCH", path, {"state": "disabled"})
        if (status := b.whoami(creds)) != 401:
            missed.append((iteration, "disabled", status))
    assert not missed, f"{len(missed)} stale answers in {ITERATIONS} iterations: {missed}"


@pytest.mark.parametrize("change", ["delete", "rotate", "revoke a permission", "unassign"])
def test_every_authorization_change_on_one_holds_on_the_other_at_once(
    two: tuple[Client, Client], admin: dict[str, str], change: str
) -> None:
    a, b = two
    role, other = (
        made_role(a, admin, name, permission)
        for name, permission in (("orders", "orders:read"), ("reports", "reports:read"))
    )
    missed: list[tuple[int, int]] = []
    for iteration in range(ITERATIONS // 2):
        # Each instance's cache holds the key before the change.
        changed(a, admin, "PATCH", f"/roles/{role}", {"permissions": ["orders:read"]})
        key, creds = made_on(a, admin, {"name": "next", "assignedRoleIds": [role]})
        assert (a.whoami(creds), b.whoami(creds)) == (200, 200)
        if change == "delete":
            status, answer = a.request("DELETE", org_path(admin, f"/keys/{key}"), admin)
            assert status == 200, answer
        elif change == "rotate":
            body = {"gracePeriodSeconds": 0}
            changed(a, admin, "POST", f"/keys/{key}/rotate", body)
        elif change == "revoke a permission":
            changed(a, admin, "PATCH", f"/roles/{role}", {"permissions": ["reports:read"]})
        else:
            changed(a, admin, "PATCH", f"/keys/{key}", {"assignedRoleIds": [other]})
        if change in ("delete", "rotate"):
            if (status := b.whoami(creds)) != 401:
                missed.append((iteration, status))
            continue
        status, answer = b.request("GET", "/v1/verify?permission=orders:read", creds)
        if status != 403:
            missed.append((iteration, status))
    assert not missed, f"{change}: {len(missed)} stale answers: {missed}"


@contextmanager
def ghost(postgres: Postgres, database: str) -> Iterator[str]:
    """A connection registered as a listening one (keysvc.db.postgres.peers, as keysvc's
    role) that acknowledges nothing: an instance stuck, from the writer's side. Its
    name is yielded."""
    name = f"{LISTENER_PREFIX}ghost"
    uri = f"{postgres.url(database)}?application_name={quote(name, safe='')}"
    command = postgres.command("psql", "--no-psqlrc", "--quiet", uri)
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        assert proc.stdin is not None
        proc.stdin.write(
            b"insert into listeners (instance, pid, backend_start) select 'ghost', pid,"
            b" backend_start from pg_stat_activity where pid = pg_backend_pid();\n"
        )
        proc.stdin.flush()
        sql = "select 1 from listeners where instance = 'ghost'"
        deadline = time.monotonic() + WAIT_SECONDS
        while not postgres.psql(database, sql):
            assert proc.poll() is None and time.monotonic() < deadline, "psql did not connect"
            time.sleep(0.05)
        yield name
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=WAIT_SECONDS)


def test_an_instance_that_never_acknowledges_holds_the_writer_up_for_the_bound_only(
    postgres: Postgres, pg_database: str, two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = two
    key, creds = cached_on_both(two, admin)
    with ghost(postgres, pg_database) as name:
        took = timed_change(a, admin, key, "disabled")
        # The live instance has heard of it all the same.
        assert b.whoami(creds) == 401
    bound = ACKNOWLEDGE_SECONDS
    assert bound - 0.1 < took < bound + SLACK_SECONDS, took
    (warned,) = lines_with(a.server, "did not acknowledge")
    assert name in warned and f"{LISTENER_PREFIX}{b.server.proc.pid}." not in warned
    logged = a.server.stderr_text()
    assert creds["keySecret"] not in logged and creds["keyId"] not in logged
    # Gone, it is waited for no more.
    assert timed_change(a, admin, key, "enabled") < bound
    assert b.whoami(creds) == 200


def test_a_stopped_listening_connection_holds_the_writer_up_no_longer_than_the_bound(
    postgres: Postgres, pg_database: str, two: tuple[Client, Client], admin: dict[str, str]
) -> None:
    a, b = two
    key, creds = cached_on_both(two, admin)
    stuck = listener_pid(postgres, pg_database, b.server)
    os.kill(stuck, signal.SIGSTOP)
    try:
        took = timed_change(a, admin, key, "disabled")
        assert took < ACKNOWLEDGE_SECONDS + SLACK_SECONDS, took
        # b's probe turns its caches cold within the same bound (give or take the
        # scheduling of two processes), and it listens again on a new connection.
        deadline = time.monotonic() + WAIT_SECONDS
        while (status := b.whoami(creds)) != 401:
            assert status == 200 and time.monotonic() < deadline, status
            time.sleep(0.05)
        lines_with(b.server, "PostgreSQL notifications back")
    finally:
        os.kill(stuck, signal.SIGCONT)
    # Listening again, b acknowledges the next change at once.
    assert timed_change(a, admin, key, "enabled") < ACKNOWLEDGE_SECONDS
    assert b.whoami(creds) == 200
