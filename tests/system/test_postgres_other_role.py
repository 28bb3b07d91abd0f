"""A command run as another login role (an operator's, with table grants and no
membership in the instances' role) sees the instances' ``backend_start`` as NULL in
pg_stat_activity, and its listening connection's clean-up took every served
instance's ``listeners`` row for an ended one and deleted it: writers then waited for
no other instance, and a key disabled through one could be served from another's
cache (the hostile review rt64 F2). A command no longer cleans up (it never
registers), and a row whose process another role cannot see is kept as live."""

import uuid

import asyncpg

from keysvc.config import Settings
from keysvc.db.postgres import peers
from keysvc.db.postgres.store import PgStore
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, bootstrap
from tests.postgres import PEER_KEY, PEPPER, Postgres
from tests.server import keysvc

LIVE = (
    "select count(*) from listeners l join pg_stat_activity a"
    " on a.pid = l.pid and a.backend_start = l.backend_start"
)


def _operator_url(postgres: Postgres, database: str) -> str:
    """A URL of ``database`` for a new login role with the tables' grants only: no
    membership in the instances' role, nor in pg_read_all_stats (call once the app
    has made the tables)."""
    role = f"ops_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {role} login nosuperuser nocreatedb nocreaterole")
    postgres.psql(
        database, f"grant select, insert, update, delete on all tables in schema public to {role}"
    )
    return f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"


async def test_a_command_as_another_role_forgets_no_instance(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> None:
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    admin = await bootstrap(client.app)
    assert postgres.psql(pg_database, LIVE) == [["1"]]  # the served app
    url = _operator_url(postgres, pg_database)
    done = keysvc(
        "export", "--db", url, "--org", admin.organization_id,
        env={"KEYSVC_PEPPER": PEPPER.hex()}, timeout=120,
    )  # fmt: skip
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
    url = _operator_url(postgres, pg_database)
    other = await PgStore.open_url(url, create=False, peer_key=PEER_KEY)
    try:
        assert postgres.psql(pg_database, LIVE) == [["2"]]
    finally:
        await other.close()


async def test_a_writer_as_another_role_waits_for_the_instances(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> None:
    """The instances a writer of that role waits for (``peers.LISTENING``): the
    served app's, though its start is hidden from that role. It listed none, so a
    command's revocation (or an instance's behind a pooler logging in as another
    role) waited for no one, and another instance served the key on (rt65 F1)."""
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    await bootstrap(client.app)
    conn = await asyncpg.connect(_operator_url(postgres, pg_database))
    try:
        hidden = await conn.fetchval(
            "select count(*) from pg_stat_activity where datname = current_database()"
            " and backend_start is null and application_name like 'keysvc-listen/%'"
        )
        listed = await conn.fetch(peers.LISTENING, "a-writer-of-that-role")
    finally:
        await conn.close()
    assert hidden == 1  # the app's listening connection, its start hidden from this role
    assert len(listed) == 1
