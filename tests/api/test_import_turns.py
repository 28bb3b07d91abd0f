"""Each app's imports queue apart (issue 37, round 3): the lock that lets one import of
an organization at a time wait for the writer is the app's own
(``keysvc.domain.imports.ImportTurns``, ``keysvc.http.state.IMPORT_TURNS``), not a
module's, which every app of a process (the tests make many) would share."""

import asyncio

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from keysvc.http.state import IMPORT_TURNS
from tests.api.activities import listed
from tests.api.importing import import_keys, record
from tests.helpers import Client, ClientFactory, Creds, FakeClock, create

# The records carry token hashes: KEYSVC_API_TOKEN_IMPORT on (off by default).
pytestmark = pytest.mark.settings(api_token_import=True)


def test_two_apps_have_their_own_import_turns(settings: Settings) -> None:
    first, second = create_app(settings), create_app(settings)
    assert first[IMPORT_TURNS] is not second[IMPORT_TURNS]


async def test_an_import_held_in_one_app_does_not_hold_another_apps(
    client: Client, admin: Creds, settings: Settings, aiohttp_client: ClientFactory
) -> None:
    # Two apps serving one database in one process, the same organization in both.
    other = await aiohttp_client(create_app(settings))
    org = admin.organization_id
    async with client.app[IMPORT_TURNS].one_at_a_time(org):
        # The other app's import goes in while this app's turn for the organization
        # is taken...
        result = await asyncio.wait_for(import_keys(other, admin, [record("other")]), 20)
        assert result["imported"] == 1 and len(other.app[IMPORT_TURNS]) == 0
        # ...while this app's own import waits for it.
        mine = asyncio.ensure_future(import_keys(client, admin, [record("mine")]))
        await asyncio.sleep(0.3)
        assert not mine.done() and len(client.app[IMPORT_TURNS]) == 1
    assert (await asyncio.wait_for(mine, 20))["imported"] == 1
    assert len(client.app[IMPORT_TURNS]) == 0
    await other.close()


async def test_an_import_is_recorded_when_it_is_written_not_when_it_arrived(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    # rt60 F7: an import that waited for its turn (and the CLI's, planned ahead) was
    # recorded at its arrival, before the writes made while it waited: the
    # organization's chain went back in time.
    org = admin.organization_id
    async with client.app[IMPORT_TURNS].one_at_a_time(org):
        held = asyncio.ensure_future(import_keys(client, admin, [record("waited")]))
        await asyncio.sleep(0.3)
        clock.advance(seconds=5)
        await create(client, admin, {"name": "made meanwhile", "roles": ["developer"]})
    assert (await asyncio.wait_for(held, 20))["imported"] == 1
    records = await listed(client, admin)  # in the chain's order
    assert [r["type"] for r in records[-2:]] == ["key_create", "key_import"]
    assert records[-1]["createdAt"] >= records[-2]["createdAt"]
