"""Small leaks: a 409 that repeats the role name sent, and debug log lines that
carry the keyed hash of a key ID someone tried (aiosqlite logs every statement
it runs, its parameters included)."""

import uuid

from keysvc.domain.roles import ROLE_NAME_TAKEN
from tests.helpers import Client, Creds, assert_error, create_role


async def test_role_name_conflict_does_not_repeat_the_name(client: Client, admin: Creds) -> None:
    name = f"ops-{uuid.uuid4().hex}"
    await create_role(client, admin, {"name": name})
    url = f"/v1/organizations/{admin.organization_id}/roles"
    response = await client.post(url, json={"name": name}, headers=admin.headers)
    await assert_error(response, 409, ROLE_NAME_TAKEN)
    assert name not in await response.text()
    assert uuid.UUID(name.removeprefix("ops-")).hex not in await response.text()
