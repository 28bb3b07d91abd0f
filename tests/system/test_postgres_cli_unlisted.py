"""keysvc's commands (`keysvc import`, its planning process, export and the operator's
commands) serve no request and answer from no cache, yet each registered itself as a
listening instance: every write that moved the authorization generation, another
tenant's disable included, then waited up to 5 s for a paused or busy command's
acknowledgement (the hostile review rt63 F2). A command's store now listens without
registering, and serves nothing from its caches; a served instance still registers."""

import asyncio
import os
import signal
import subprocess
import sys
import time

from keysvc.config import Settings
from keysvc.db.postgres.notifications import ACKNOWLEDGE_SECONDS
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, assert_ok, bootstrap, create_creds, keys_url
from tests.postgres import PEPPER, Postgres

LISTED = "select count(*) from listeners"
# Listening connections open on the database: the app's, and the import's once it is up.
LISTENING = (
    "select count(*) from pg_stat_activity"
    " where datname = current_database() and application_name like 'keysvc-listen/%'"
)


async def test_a_paused_command_delays_no_tenants_disable(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> None:
    url = postgres.url(pg_database)
    settings = Settings(db_url=url, pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    admin = await bootstrap(client.app)
    key = await create_creds(client, admin, {"name": "k", "roles": ["developer"]})
    assert postgres.psql(pg_database, LISTED) == [["1"]]  # the served app
    env = {**os.environ, "KEYSVC_PEPPER": PEPPER.hex()}
    # An import from standard input: its store open, waiting for its first line.
    command = [sys.executable, "-m", "keysvc", "import", "--db", url, "--org",
               admin.organization_id, "-"]  # fmt: skip
    importing = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and postgres.psql(pg_database, LISTENING) != [["2"]]:
            await asyncio.sleep(0.1)
        assert postgres.psql(pg_database, LISTENING) == [["2"]], importing.stderr
        assert postgres.psql(pg_database, LISTED) == [["1"]]  # the import's is no instance
        os.kill(importing.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            response = await client.patch(
                keys_url(admin, key.id), json={"state": "disabled"}, headers=admin.headers
            )
            waited = time.monotonic() - started
        finally:
            os.kill(importing.pid, signal.SIGCONT)
        assert (await assert_ok(response))["state"] == "disabled"
        assert waited < ACKNOWLEDGE_SECONDS / 2, waited
    finally:
        importing.communicate(b"", timeout=60)
    assert importing.returncode == 0, importing.stderr
