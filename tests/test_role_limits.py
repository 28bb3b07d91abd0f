"""Bounds on roles: custom roles per organization, and the role list in pages read with a
fixed number of statements."""

import asyncio
from typing import Any

import pytest

from keysvc.config import build_settings
from keysvc.state import STORE
from tests.conftest import (
    Client,
    ClientFactory,
    bootstrap,
    client_with,
    create,
    create_role,
)
from tests.helpers import Creds, FakeClock, assert_error, assert_ok, count_reads
from tests.test_roles import keys_url, roles_url

SYSTEM_ROLES = ["admin", "developer", "query_endpoints"]
BAD_CURSOR = "cursor: not a cursor from this list; start again without it"


async def list_page(client: Client, admin: Creds, **params: str) -> dict[str, Any]:
    response = await client.get(roles_url(admin), params=params, headers=admin.headers)
    await assert_ok(response)
    page: dict[str, Any] = await response.json()
    return page


async def walk(client: Client, admin: Creds, limit: int) -> tuple[list[str], set[int]]:
    """Every role's name through the pages of ``limit``, and the totalCounts reported."""
    names: list[str] = []
    totals: set[int] = set()
    params = {"limit": str(limit)}
    while True:
        page = await list_page(client, admin, **params)
        assert len(page["result"]) <= limit
        names.extend(role["name"] for role in page["result"])
        totals.add(page["totalCount"])
        if page["nextCursor"] is None:
            return names, totals
        params = {"limit": str(limit), "cursor": page["nextCursor"]}


# Custom roles per organization.


def test_the_cap_is_a_setting() -> None:
    assert build_settings({}, {}).max_roles_per_org == 1000
    assert build_settings({}, {"KEYSVC_MAX_ROLES_PER_ORG": "7"}).max_roles_per_org == 7
    assert build_settings({"max_roles_per_org": "9"}, {}).max_roles_per_org == 9


async def test_past_the_cap_a_create_is_409_and_writes_nothing(
    aiohttp_client: ClientFactory, settings: Any, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_roles_per_org=3)
    admin, other = await bootstrap(client.app), await bootstrap(client.app, "other")
    for name in ("a", "b", "c"):
        await create_role(client, admin, {"name": name})
    key = await create(client, admin, {"name": "k", "roles": ["developer"]})
    body = {"name": "d", "permissions": ["reports:read"], "actors": [f"apiKey/{key['key']['id']}"]}
    response = await client.post(roles_url(admin), json=body, headers=admin.headers)
    await assert_error(
        response, 409, "this organization has reached its limit of 3 custom roles;"
        " delete one it no longer needs",
    )  # fmt: skip
    names, totals = await walk(client, admin, 250)
    assert names == [*SYSTEM_ROLES, "a", "b", "c"] and totals == {6}
    held = await assert_ok(
        await client.get(keys_url(admin, key["key"]["id"]), headers=admin.headers)
    )
    assert [role["roleName"] for role in held["assignedRoles"]] == ["developer"]
    # Another organization has its own count; a deleted role makes room.
    await create_role(client, other, {"name": "d"})
    a_role = next(r for r in (await list_page(client, admin))["result"] if r["name"] == "a")
    await assert_ok(await client.delete(roles_url(admin, a_role["id"]), headers=admin.headers))
    await create_role(client, admin, {"name": "d"})


async def test_the_cap_holds_against_concurrent_creates(
    aiohttp_client: ClientFactory, settings: Any, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_roles_per_org=5)
    admin = await bootstrap(client.app)
    responses = await asyncio.gather(
        *(
            client.post(roles_url(admin), json={"name": f"r{i}"}, headers=admin.headers)
            for i in range(12)
        )
    )
    assert sorted(response.status for response in responses) == [200] * 5 + [409] * 7
    names, totals = await walk(client, admin, 250)
    assert len(names) == 3 + 5 and totals == {8}


# The list in pages.

NAMES = ["zeta", "Alpha", "alpha", "b", "b b", "\u00e9t\u00e9", "\U0001f511 keys", "x" * 255,
         "\u05de\u05e4\u05ea\u05d7", "admin2", "0", "m"]  # fmt: skip


@pytest.mark.parametrize("limit", [1, 2, 5, 250])
async def test_pages_walk_every_role_exactly_once(client: Client, admin: Creds, limit: int) -> None:
    for name in NAMES:
        await create_role(client, admin, {"name": name})
    names, totals = await walk(client, admin, limit)
    # System roles first, then custom roles by name (code point order), each once.
    assert names == [*SYSTEM_ROLES, *sorted(NAMES)]
    assert totals == {len(SYSTEM_ROLES) + len(NAMES)}


async def test_a_list_without_parameters_is_the_first_page(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    page = await list_page(client, admin)
    assert set(page) == {"status", "requestId", "result", "nextCursor", "totalCount"}
    assert [r["name"] for r in page["result"]] == [*SYSTEM_ROLES, "r"]
    assert page["result"][-1] == role
    assert page["nextCursor"] is None and page["totalCount"] == 4


async def test_a_role_added_or_removed_between_pages(client: Client, admin: Creds) -> None:
    for name in ("b", "d", "f"):
        await create_role(client, admin, {"name": name})
    first = await list_page(client, admin, limit="4")
    assert [r["name"] for r in first["result"]] == [*SYSTEM_ROLES, "b"]
    await create_role(client, admin, {"name": "a"})  # before the cursor: not seen
    await create_role(client, admin, {"name": "e"})  # after it: seen
    gone = next(r for r in (await list_page(client, admin))["result"] if r["name"] == "b")
    await assert_ok(await client.delete(roles_url(admin, gone["id"]), headers=admin.headers))
    rest = await list_page(client, admin, limit="4", cursor=first["nextCursor"])
    assert [r["name"] for r in rest["result"]] == ["d", "e", "f"]
    assert rest["nextCursor"] is None and rest["totalCount"] == 3 + 4


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": "0"}, "limit: must be an integer from 1 to 250"),
        ({"limit": "251"}, "limit: must be an integer from 1 to 250"),
        ({"limit": "x"}, "limit: must be an integer from 1 to 250"),
        ({"cursor": "bogus"}, BAD_CURSOR),
        ({"cursor": "YWRtaW4.AAAAAAAAAAAAAAAAAAAAAA"}, BAD_CURSOR),
        ({"cursor": "a" * 2000 + ".x"}, BAD_CURSOR),
    ],
)
async def test_bad_paging_parameters(
    client: Client, admin: Creds, params: dict[str, str], message: str
) -> None:
    response = await client.get(roles_url(admin), params=params, headers=admin.headers)
    await assert_error(response, 400, message)


async def test_a_cursor_is_good_only_for_its_organization(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    await create_role(client, admin, {"name": "r"})
    cursor = (await list_page(client, admin, limit="1"))["nextCursor"]
    response = await client.get(
        roles_url(other_admin), params={"cursor": cursor}, headers=other_admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


async def test_a_page_is_read_in_a_fixed_number_of_statements(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(30):
        role = await create_role(client, admin, {"name": f"r{index:02}"})
        await create(client, admin, {"name": f"k{index}", "assignedRoleIds": [role["id"]]})
    await list_page(client, admin, limit="1")  # the caller's credential is cached now
    counts = {}
    for limit in (1, 5, 33):
        statements = count_reads(client.app[STORE], monkeypatch)
        page = await list_page(client, admin, limit=str(limit))
        assert len(page["result"]) == limit
        assert all(len(role["actors"]) == 1 for role in page["result"][3:])
        counts[limit] = len(statements)
        monkeypatch.undo()
    # The page, the keys holding its roles, and the count: whatever the page size.
    assert counts == {1: 3, 5: 3, 33: 3}
