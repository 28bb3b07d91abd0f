"""Fixtures of the API tests: the hostile corpus's targets (a key and a role to aim at),
and a webhook receiver on a loopback port."""

from collections.abc import AsyncIterator

import pytest

from tests.api.hostile import Targets, org_url
from tests.helpers import Client, Creds, assert_ok, create
from tests.receiver import Receiver


@pytest.fixture
async def targets(client: Client, admin: Creds) -> Targets:
    key = await create(client, admin, {"name": "target", "roles": ["developer"]})
    response = await client.post(
        org_url(admin, "/roles"),
        json={"name": "target", "permissions": ["reports:read"]},
        headers=admin.headers,
    )
    role = await assert_ok(response)
    return Targets(admin, key["key"]["id"], role["id"])


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    started = await Receiver().start()
    yield started
    await started.stop()
