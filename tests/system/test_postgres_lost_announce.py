"""A disable committed and acknowledged by PostgreSQL whose announcement is lost: the
writer's connection is cut by a loopback relay (tests/pgfaults.py's ``CommitCutter``,
``after_reply``) right after the COMMIT's reply, before its ``pg_notify``. The writer
cannot tell the other instances, so it answers after ACKNOWLEDGE_SECONDS, by when
every instance has read the generation by polling: the other instance refuses the key
on its first request after the answer."""

import time

import pytest

from keysvc.config import Settings
from keysvc.db.postgres.notifications import ACKNOWLEDGE_SECONDS
from keysvc.http.app import create_app
from tests.helpers import (
    Client,
    ClientFactory,
    assert_error,
    assert_ok,
    bootstrap,
    create_creds,
    keys_url,
)
from tests.pgfaults import CommitCutter, announce_cutter
from tests.postgres import PEPPER, SUPERUSER, Postgres

# The PATCH's write (keysvc.db.keys' update of a key), as its Parse message carries it.
UPDATE_KEY = b"update api_keys set name = "


cutter = announce_cutter()


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    """Asked for before aiohttp_client: the database outlives the apps."""
    return postgres.url(pg_database)


async def test_a_disable_whose_announcement_is_lost_is_answered_once_every_instance_polled(
    url: str, postgres: Postgres, pg_database: str, cutter: CommitCutter,
    aiohttp_client: ClientFactory,
) -> None:  # fmt: skip
    port = await cutter.start()
    relayed = f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{pg_database}"
    a: Client = await aiohttp_client(create_app(Settings(db_url=relayed, pepper=PEPPER)))
    b: Client = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    admin = await bootstrap(a.app)
    key = await create_creds(a, admin, {"name": "k", "roles": ["developer"]})
    assert (await b.get("/v1/whoami", headers=key.headers)).status == 200  # cached on b
    cutter.marker = UPDATE_KEY
    started = time.monotonic()
    response = await a.patch(
        keys_url(admin, key.id), json={"state": "disabled"}, headers=admin.headers
    )
    took = time.monotonic() - started
    assert cutter.cuts == 1
    assert (await assert_ok(response))["state"] == "disabled"
    await assert_error(await b.get("/v1/whoami", headers=key.headers), 401, "key is disabled")
    assert took >= ACKNOWLEDGE_SECONDS - 0.1, took
