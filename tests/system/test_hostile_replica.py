"""The hostile review of read replicas (issue 39): what a caller without a key, or a
replica that is not what it seems, can learn or do through ``--pg-replicas``; a real
primary, a streaming standby made by ``pg_basebackup`` and a real ``keysvc serve``
(tests/pginstances.py).

A failed credential check costs the same reads on every target, whether the key ID is
unknown or the secret wrong, cached or not: a replica's failure is asked again of the
primary either way, so neither the time of a 401 nor ``keysvc_db_reads_total`` tells
an existing key ID from an unknown one."""

import json
import time
from collections.abc import Iterator

import pytest

from keysvc.credentials import new_key_id, new_secret
from keysvc.db.postgres.replicas import PRIMARY
from tests.pginstances import (
    ENV,
    Client,
    lines_with,
    made_on,
    metric,
    metrics_text,
    replica_admin,
    replica_database,
    replica_reads,
    replica_up,
    standby,
    wait_until,
)
from tests.postgres import Postgres, start_pgbouncer, start_postgres, start_standby, stop_postgres
from tests.server import Server, keysvc

__all__ = ["replica_admin", "replica_database", "standby"]

SAMPLES = 20
LSN = "select pg_current_wal_lsn()"
# A write, then a new WAL segment: 16 MB further each time.
SWITCH = (
    "create table if not exists ahead (n int); insert into ahead values (1); select pg_switch_wal()"
)
# How far past this cluster's position the other one is pushed (bytes).
AHEAD = 64 << 20
# How long a replica that must stay out is watched (its state is read every second).
CHECKS = 4.0


@pytest.fixture(scope="module")
def one(postgres: Postgres, replica_database: str, standby: Postgres) -> Iterator[Client]:
    args = ["--pg-replicas", standby.url(replica_database)]
    with Server(postgres.url(replica_database), env=ENV, args=args) as server:  # type: ignore[arg-type]
        client = Client(server)
        wait_until(lambda: replica_up(server))
        yield client
        client.close()


def reads_by_target(server: Server) -> dict[str, float]:
    """``keysvc_db_reads_total``, by its ``target`` label."""
    found: dict[str, float] = {}
    for line in metrics_text(server).splitlines():
        if line.startswith('keysvc_db_reads_total{target="'):
            label, value = line.rsplit(" ", 1)
            found[label.split('"')[1]] = float(value)
    return found


def reads_of(client: Client, creds: list[dict[str, str]]) -> dict[str, float]:
    """The reads, by target, that refusing each of ``creds`` cost."""
    before = reads_by_target(client.server)
    for each in creds:
        assert client.whoami(each) == 401
    after = reads_by_target(client.server)
    return {target: after[target] - before.get(target, 0) for target in after}


def test_an_unknown_key_id_and_a_wrong_secret_cost_the_same_reads_on_each_target(
    one: Client, replica_admin: dict[str, str]
) -> None:
    _, creds = made_on(one, replica_admin, {"name": "probed", "roles": ["developer"]})
    wrong = [{"keyId": creds["keyId"], "keySecret": new_secret()} for _ in range(SAMPLES)]
    # Checks do read the replica once it has replayed the create.
    wait_until(lambda: one.whoami(wrong[0]) == 401 and replica_reads(one.server) > 0)
    unknown = [{"keyId": new_key_id(), "keySecret": new_secret()} for _ in range(SAMPLES)]
    for _ in range(3):  # a background read can land in one count: the same thrice is not
        wrong_reads, unknown_reads = reads_of(one, wrong), reads_of(one, unknown)
        if wrong_reads[PRIMARY] == unknown_reads[PRIMARY] == SAMPLES:
            break
    # Each failed check read the primary once, after the replica (or in its stead, when
    # the replica had not replayed far enough yet): found on it or not.
    assert wrong_reads[PRIMARY] == unknown_reads[PRIMARY] == SAMPLES
    for counts in (wrong_reads, unknown_reads):
        assert sum(counts.values()) - counts[PRIMARY] >= SAMPLES / 2


@pytest.fixture(scope="module")
def foreign(postgres: Postgres) -> Iterator[tuple[Postgres, str, dict[str, str]]]:
    """A standby of another cluster (another keysvc deployment, sharing the pepper, as a
    staging copy does), with a database of its own bootstrapped there; the other
    cluster's WAL position pushed past this one's, so the position rule alone lets
    reads through."""
    other = start_postgres()
    try:
        name = other.fresh_database()
        done = keysvc("bootstrap", "--db", other.url(name), env=ENV)
        assert done.returncode == 0, done.stderr
        mark = postgres.psql("postgres", LSN)[0][0]
        ahead = f"select pg_current_wal_lsn() > '{mark}'::pg_lsn + {AHEAD}"
        while other.psql("postgres", ahead) != [["t"]]:
            other.psql("postgres", SWITCH)
        replica = start_standby(other)
        try:
            wait_until(lambda: replica.psql(name, "select 1 from api_keys limit 1") != [])
            yield replica, name, dict(json.loads(done.stdout))
        finally:
            stop_postgres(replica)
    finally:
        stop_postgres(other)


def test_a_standby_of_another_cluster_is_left_out_and_its_keys_refused(
    postgres: Postgres,
    replica_database: str,
    foreign: tuple[Postgres, str, dict[str, str]],
) -> None:
    replica, name, stranger = foreign
    args = ["--pg-replicas", replica.url(name)]
    with Server(postgres.url(replica_database), env=ENV, args=args) as server:  # type: ignore[arg-type]
        client = Client(server)
        try:
            deadline = time.monotonic() + CHECKS
            while time.monotonic() < deadline:  # never taken in, whatever it replays
                assert client.whoami(stranger) == 401
                assert metric(server, "keysvc_replica_up") == 0
                time.sleep(0.2)
            lines_with(server, "left out (not a standby of the primary")
        finally:
            client.close()


def test_a_replica_behind_a_pooler_in_transaction_mode_serves_reads(
    postgres: Postgres, replica_database: str, standby: Postgres, replica_admin: dict[str, str]
) -> None:
    """A replica named through PgBouncer (transaction pooling), as large fleets put
    their replicas: its connections are not refused for a startup parameter, and keep
    no statement prepared across the pooler's server connections."""
    pooler = start_pgbouncer(standby, replica_database)
    url = postgres.url(replica_database)
    env = {**ENV, "KEYSVC_PG_LISTEN_URL": url}
    try:
        with Server(url, env=env, args=["--pg-replicas", pooler.url]) as server:  # type: ignore[arg-type]
            client = Client(server)
            try:
                _, creds = made_on(
                    client, replica_admin, {"name": "pooled", "roles": ["developer"]}
                )
                wrong = {"keyId": creds["keyId"], "keySecret": new_secret()}
                wait_until(lambda: client.whoami(wrong) == 401 and replica_reads(server) > 0)
                for _ in range(SAMPLES):  # each on whichever server connection is free
                    assert client.whoami(wrong) == 401
                assert replica_up(server)
                assert "unsupported startup parameter" not in pooler.log_text()
            finally:
                client.close()
    finally:
        pooler.stop()
