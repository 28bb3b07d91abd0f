"""A command run as another login role (an operator's, with table grants and no
membership in the instances' role) sees the instances' ``backend_start`` as NULL in
pg_stat_activity, and its listening connection's clean-up took every served
instance's ``listeners`` row for an ended one and deleted it: writers then waited for
no other instance, and a key disabled through one could be served from another's
cache (the hostile review rt64 F2). A command no longer cleans up (it never
registers), and a row whose process another role cannot see is kept as live."""

import os
import subprocess
import sys
import uuid

from keysvc.config import Settings
from keysvc.db.postgres.store import PgStore
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, bootstrap
from tests.postgres import PEER_KEY, PEPPER, Postgres

LIVE = (
    "select count(*) from listeners l join pg_stat_activity a"
    " on a.pid = l.pid and a.backend_start = l.backend_start"
)


async def test_a_command_as_another_role_forgets_no_instance(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> None:
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    admin = await bootstrap(client.app)
    assert postgres.psql(pg_database, LIVE) == [["1"]]  # the served app
    role = f"ops_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {role} login nosuperuser nocreatedb nocreaterole")
    postgres.psql(
        pg_database,
        f"grant select, insert, update, delete on all tables in schema public to {role}",
    )
    url = f"postgresql://{role}@127.0.0.1:{postgres.port}/{pg_database}"
    done = subprocess.run(
        [sys.executable, "-m", "keysvc", "export", "--db", url, "--org", admin.organization_id],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KEYSVC_PEPPER": PEPPER.hex()},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1  # the admin key
    assert postgres.psql(pg_database, LIVE) == [["1"]]  # still registered


async def test_an_instance_as_another_role_forgets_no_other_instance(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> None:
    """The clean-up itself, run by a registered store of that role (the docs ask
    instances to share one role; a row it cannot see is kept all the same)."""
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    await bootstrap(client.app)
    role = f"ops_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {role} login nosuperuser nocreatedb nocreaterole")
    postgres.psql(
        pg_database,
        f"grant select, insert, update, delete on all tables in schema public to {role}",
    )
    url = f"postgresql://{role}@127.0.0.1:{postgres.port}/{pg_database}"
    other = await PgStore.open_url(url, create=False, peer_key=PEER_KEY)
    try:
        assert postgres.psql(pg_database, LIVE) == [["2"]]
    finally:
        await other.close()
