"""Reads on a real hot standby (``--pg-replicas``, keysvc.db.postgres.replicas): a
primary and a streaming replica made by ``pg_basebackup`` on loopback
(tests/postgres.py), two real ``keysvc serve`` processes reading from it.

With the replica's replay paused (``pg_wal_replay_pause()``), a key disabled through
one instance is refused by both from the very next request, every time; a key
created through one is found through the other; a replica stopped, or lagging past
the bound, is left out (logged, ``/metrics``) while the instances keep answering,
and taken back once it is well."""

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from functools import partial

import pytest

from tests.pginstances import (
    ENV,
    WAIT_SECONDS,
    Client,
    changed,
    flipped,
    lines_with,
    listening,
    made_on,
    metric,
    org_path,
    paused,
    replica_admin,
    replica_database,
    replica_reads,
    replica_up,
    resumed,
    standby,
    wait_until,
)
from tests.postgres import Postgres
from tests.server import Server

# The module's fixtures (tests/pginstances.py): one database, replicated, bootstrapped.
__all__ = ["replica_admin", "replica_database", "standby"]

ROUNDS = 20
# A webhook to a public address literal (no name to resolve), for an event no test makes.
WEBHOOK = {"url": "https://93.184.215.14/hooks", "events": ["key.deleted"]}
ATTEMPTS = 5
# The replay lag past which the instances leave the replica out (seconds).
MAX_LAG = 2


@pytest.fixture(scope="module")
def database(replica_database: str) -> str:
    return replica_database


@pytest.fixture(scope="module")
def admin(replica_admin: dict[str, str]) -> dict[str, str]:
    return replica_admin


@pytest.fixture(scope="module")
def two(
    postgres: Postgres, database: str, standby: Postgres, admin: dict[str, str]
) -> Iterator[tuple[Client, Client]]:
    url, replica = postgres.url(database), standby.url(database)
    args = ["--pg-replicas", replica, "--pg-replica-max-lag", str(MAX_LAG)]
    with (
        Server(url, env=ENV, args=args) as a,  # type: ignore[arg-type]
        Server(url, env=ENV, args=args) as b,  # type: ignore[arg-type]
    ):
        clients = Client(a), Client(b)
        for server in (a, b):
            wait_until(partial(replica_up, server))
        yield clients
        for client in clients:
            client.close()


def test_a_key_disabled_while_replay_is_paused_is_refused_by_every_instance(
    two: tuple[Client, Client], admin: dict[str, str], standby: Postgres
) -> None:
    a, b = two
    key, creds = made_on(a, admin, {"name": "paused", "roles": ["developer"]})
    path = f"/keys/{key}"
    # Reads do use the replica: a key read through each instance once it has replayed.
    before = replica_reads(b.server)
    wait_until(
        lambda: (
            b.request("GET", org_path(admin, path), admin)[0] == 200
            and replica_reads(b.server) > before
        )
    )
    paused(standby)
    try:
        missed = flipped(a, {"b": b, "a": a}, admin, key, creds, ROUNDS)
        assert missed == []
        # The replica still holds the key as it was before the pause.
        assert standby.psql("postgres", "select pg_is_wal_replay_paused()") == [["t"]]
    finally:
        resumed(standby)


def test_a_key_created_through_one_is_found_through_the_other_while_replay_is_paused(
    two: tuple[Client, Client], admin: dict[str, str], standby: Postgres
) -> None:
    a, b = two
    paused(standby)
    try:
        for round_ in range(5):
            key, creds = made_on(a, admin, {"name": f"new {round_}", "roles": ["developer"]})
            assert b.request("GET", org_path(admin, f"/keys/{key}"), admin)[0] == 200
            assert b.whoami(creds) == 200
            assert a.whoami(creds) == 200
    finally:
        resumed(standby)


def test_a_key_or_webhook_created_before_the_other_instance_hears_of_it_is_found_there(
    postgres: Postgres,
    database: str,
    two: tuple[Client, Client],
    admin: dict[str, str],
    standby: Postgres,
) -> None:
    """The other instance's listening connection stopped (SIGSTOP of its server
    process): for a moment it has not heard of the create, reads the paused replica,
    misses, and asks the primary (a replica's miss is a cache miss)."""
    a, b = two
    existing, _ = made_on(a, admin, {"name": "existing", "roles": ["developer"]})
    (pid,) = [int(value) for value in listening(postgres, database, b.server, "pid")]
    routed = 0  # the attempts whose read did go to the replica

    def on_the_replica() -> bool:
        """Whether a read of ``existing`` through ``b`` now goes to the replica."""
        read = replica_reads(b.server)
        found = b.request("GET", org_path(admin, f"/keys/{existing}"), admin)[0] == 200
        return found and replica_reads(b.server) > read

    for attempt in range(ATTEMPTS):
        wait_until(on_the_replica)
        paused(standby)
        os.kill(pid, signal.SIGSTOP)
        try:
            key, creds = made_on(a, admin, {"name": f"unheard {attempt}", "roles": ["developer"]})
            status, made = a.request("POST", org_path(admin, "/webhooks"), admin, WEBHOOK)
            assert status == 200, made
            hook = made["result"]["webhook"]["id"]
            before = replica_reads(b.server)
            assert b.request("GET", org_path(admin, f"/keys/{key}"), admin)[0] == 200
            # Not a point read of a key: found all the same (an empty answer from a
            # replica is asked of the primary).
            assert b.request("GET", org_path(admin, f"/webhooks/{hook}"), admin)[0] == 200
            routed += replica_reads(b.server) > before
            assert b.whoami(creds) == 200
        finally:
            os.kill(pid, signal.SIGCONT)
            resumed(standby)
        if routed:
            break
    # Not vacuous: a write in the background (a usage flush) can send the read to the
    # primary; one attempt at least read the replica and missed.
    assert routed


def test_a_replica_stopped_or_lagging_is_left_out_and_taken_back(
    two: tuple[Client, Client], admin: dict[str, str], standby: Postgres
) -> None:
    a, b = two
    key, creds = made_on(a, admin, {"name": "kept", "roles": ["developer"]})
    logged = b.server.stderr_text().count("left out")  # by the tests before
    standby.run("pg_ctl", "stop", "--mode=fast", "--wait", f"--pgdata={standby.data}")
    try:
        lines_with(b.server, "left out (down")
        assert metric(b.server, "keysvc_replica_up") == 0
        assert b.whoami(creds) == 200
        assert b.request("GET", org_path(admin, f"/keys/{key}"), admin)[0] == 200
        with urllib.request.urlopen(f"{b.server.base}/readyz", timeout=WAIT_SECONDS) as ready:
            assert ready.status == 200
    finally:
        standby.restart()
    lines_with(b.server, "back in")
    # One line each way for the outage, whatever the reads meanwhile found.
    assert b.server.stderr_text().count("left out") == logged + 1
    wait_until(lambda: metric(b.server, "keysvc_replica_up") == 1)
    # Paused with writes going on: lagging past the bound (2 s), then left out.
    paused(standby)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while metric(b.server, "keysvc_replica_up") == 1:
            assert time.monotonic() < deadline, "never left out"
            changed(a, admin, "PATCH", f"/keys/{key}", {"name": f"n{time.monotonic()}"})
            time.sleep(0.2)
        assert metric(b.server, "keysvc_replica_lag_seconds") > MAX_LAG
        lines_with(b.server, "left out (lagging")
        assert b.whoami(creds) == 200
    finally:
        resumed(standby)
    wait_until(lambda: metric(b.server, "keysvc_replica_up") == 1)
    assert metric(b.server, "keysvc_replica_lag_seconds") < MAX_LAG
