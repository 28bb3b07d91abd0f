"""A page of keys is kept as text while nothing is committed: repeating it runs no
query, and any commit (here or by another process) is in the very next answer."""

from collections import OrderedDict
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.http.state import STORE
from keysvc.http.views import keys as keys_handlers
from tests.handsql import hand_sql
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    client_with,
    count_reads,
    create,
    create_creds,
    create_role,
)


def keys_url(creds: Creds, query: str = "") -> str:
    return f"/v1/organizations/{creds.organization_id}/keys{query}"


async def listed(client: Client, creds: Creds, query: str = "") -> dict[str, Any]:
    response = await client.get(keys_url(creds, query), headers=creds.headers)
    body: dict[str, Any] = await response.json()
    await assert_ok(response)
    return body


async def test_a_repeated_page_runs_no_query(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create(client, admin, {"name": "one", "roles": ["developer"]})
    first = await listed(client, admin)
    reads = count_reads(client.app[STORE], monkeypatch)
    again = await listed(client, admin)
    assert reads == []
    assert again["result"] == first["result"] and again["totalCount"] == 2
    assert again["requestId"] != first["requestId"]


async def test_every_commit_is_in_the_next_page(
    client: Client, admin: Creds, settings: Settings, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    before = await listed(client, admin)
    assert [k["name"] for k in before["result"]] == ["acme admin", "dev"]

    await create(client, admin, {"name": "new", "roles": ["developer"]})  # a create
    page = await listed(client, admin)
    assert [k["name"] for k in page["result"]][-1] == "new" and page["totalCount"] == 3

    await assert_ok(  # an update
        await client.patch(keys_url(admin, f"/{dev.id}"), json={"name": "d"}, headers=admin.headers)
    )
    assert [k["name"] for k in (await listed(client, admin))["result"]][1] == "d"

    # usedAt, written by the key's first request of a minute
    clock.advance(minutes=2)
    assert (await client.get("/v1/verify", headers=dev.headers)).status == 200
    used = {k["id"]: k.get("usedAt") for k in (await listed(client, admin))["result"]}
    assert used[dev.id] == clock.now.strftime("%Y-%m-%dT%H:%M:00Z")

    # another process's commit: a connection of its own renames the key
    hand_sql(settings, "update api_keys set name = 'renamed elsewhere' where id = ?", dev.id)
    assert [k["name"] for k in (await listed(client, admin))["result"]][1] == "renamed elsewhere"

    await assert_ok(await client.delete(keys_url(admin, f"/{dev.id}"), headers=admin.headers))
    page = await listed(client, admin)
    assert dev.id not in [k["id"] for k in page["result"]] and page["totalCount"] == 2


async def test_pages_are_kept_apart(
    client: Client, admin: Creds, other_admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(4):
        await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
    await listed(client, other_admin)  # its first use this minute writes its usedAt

    async def pages() -> dict[str, list[str]]:
        first = await listed(client, admin, "?limit=2")
        after = await listed(client, admin, f"?limit=2&cursor={first['nextCursor']}")
        return {
            "first two": [k["name"] for k in first["result"]],
            "next two": [k["name"] for k in after["result"]],
            "all": [k["name"] for k in (await listed(client, admin))["result"]],
            "other": [k["name"] for k in (await listed(client, other_admin))["result"]],
        }

    expected = {
        "first two": ["acme admin", "k0"],
        "next two": ["k1", "k2"],
        "all": ["acme admin", "k0", "k1", "k2", "k3"],
        "other": ["other admin"],
    }
    assert await pages() == expected
    reads = count_reads(client.app[STORE], monkeypatch)
    assert await pages() == expected  # every one of them kept, none mixed up
    assert reads == []


async def test_no_cache_means_no_kept_pages(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, cache_size=0)
    admin = await bootstrap(client.app)
    await listed(client, admin)
    await listed(client, admin)
    assert client.app[STORE].caches.pages_kept() == 0


async def test_a_row_read_again_unchanged_gives_the_same_record(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    """So a page read again after one key's usedAt moved rebuilds only that key."""
    org = admin.organization_id
    store = client.app[STORE]
    role = await create_role(client, admin, {"name": "ops", "permissions": ["reports:read"]})
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    ops = await create_creds(client, admin, {"name": "ops", "assignedRoleIds": [role["id"]]})
    before = {key.id: key for key in (await store.list_keys(org, 0, 100)).keys}

    clock.advance(minutes=1)
    assert (await client.get("/v1/verify", headers=dev.headers)).status == 200  # usedAt moves
    after = {key.id: key for key in (await store.list_keys(org, 0, 100)).keys}
    assert after[dev.id] is not before[dev.id] and after[dev.id].used_at is not None
    assert after[admin.id] is before[admin.id] and after[ops.id] is before[ops.id]

    await assert_ok(  # the role changes: its holder is a new record with what it now grants
        await client.patch(
            f"/v1/organizations/{org}/roles/{role['id']}",
            json={"permissions": ["reports:write"]},
            headers=admin.headers,
        )
    )
    again = {key.id: key for key in (await store.list_keys(org, 0, 100)).keys}
    assert again[ops.id] is not after[ops.id]
    assert again[ops.id].permissions == frozenset({"reports:write"})
    assert again[dev.id] is after[dev.id]


async def test_list_parameters_are_validated_once_per_query_string(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query string seen before is not validated again; a refused one is never kept,
    and the kept ones are bounded."""
    monkeypatch.setattr(keys_handlers, "_LIST_PARAMS", OrderedDict())
    loads: list[object] = []
    original = keys_handlers._list_query.load

    def counting(data: Any, **kwargs: Any) -> Any:
        loads.append(data)
        return original(data, **kwargs)

    monkeypatch.setattr(keys_handlers._list_query, "load", counting)
    first = await listed(client, admin, "?limit=1")
    again = await listed(client, admin, "?limit=1")
    assert len(loads) == 1 and again["result"] == first["result"] and len(again["result"]) == 1
    for _ in range(2):
        response = await client.get(keys_url(admin, "?limit=0"), headers=admin.headers)
        assert response.status == 400
    assert len(loads) == 3 and list(keys_handlers._LIST_PARAMS) == ["limit=1"]
    for n in range(keys_handlers.LIST_PARAMS_KEPT + 20):  # distinct texts: 001, ..., 0001
        await listed(client, admin, f"?limit={n % 250 + 1:0{3 + n // 250}d}")
    assert len(keys_handlers._LIST_PARAMS) == keys_handlers.LIST_PARAMS_KEPT
    with pytest.raises(TypeError):
        next(iter(keys_handlers._LIST_PARAMS.values()))["limit"] = 5  # type: ignore[index]
