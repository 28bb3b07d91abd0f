"""Under which outcome an admitted key's request counts in its usage when a view,
not ``authorize*``, decides its answer: any 403 is ``forbidden``, whatever raised
it; any other answer (a 400 for its query or body, a 404) is the key's ``success``."""

import uuid

import pytest

from tests.api.usage import NOTHING, clock_at_moment, totals
from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    create_creds,
    create_role,
)


@pytest.fixture
def clock() -> FakeClock:
    return clock_at_moment()


@pytest.fixture
async def keeper(client: Client, admin: Creds) -> Creds:
    """A key that may read and update keys, but holds fewer permissions than the admin."""
    role = await create_role(
        client, admin, {"name": "keeper", "permissions": ["keys:read", "keys:update"]}
    )
    return await create_creds(client, admin, {"name": "keeper", "assignedRoleIds": [role["id"]]})


async def test_a_views_own_refusals_count_as_forbidden(
    client: Client, admin: Creds, keeper: Creds
) -> None:
    keys_url = f"/v1/organizations/{admin.organization_id}/keys"
    # Acting on a stronger key, and on its own access: refused by the domain, not authorize.
    response = await client.patch(
        f"{keys_url}/{admin.id}", json={"name": "renamed"}, headers=keeper.headers
    )
    await assert_error(
        response, 403, "cannot change this key: it holds a permission this key lacks"
    )
    response = await client.patch(
        f"{keys_url}/{keeper.id}", json={"state": "disabled"}, headers=keeper.headers
    )
    await assert_error(
        response, 403, "a key cannot change its own state: use another key to change it"
    )
    assert await totals(client, admin, keeper.id) == {
        **NOTHING,
        "forbidden": 2,
    }


async def test_other_refusals_of_an_admitted_key_count_as_success(
    client: Client, admin: Creds, keeper: Creds
) -> None:
    response = await client.get("/v1/verify?permission=not-a-permission", headers=keeper.headers)
    await assert_error(response, 400, "permission: must be namespace:action, such as reports:read")
    url = f"/v1/organizations/{admin.organization_id}/keys/{uuid.uuid4()}"
    await assert_error(
        await client.get(url, headers=keeper.headers), 404, "key not found in this organization"
    )
    await assert_ok(await client.get("/v1/whoami", headers=keeper.headers))
    # And one refused by authorize, as before.
    keys_url = f"/v1/organizations/{admin.organization_id}/keys"
    response = await client.post(keys_url, json={"name": "x"}, headers=keeper.headers)
    await assert_error(response, 403, "this key lacks the permission keys:create")
    assert await totals(client, admin, keeper.id) == {
        **NOTHING,
        "success": 3,
        "forbidden": 1,
    }
