"""The activity list as a client generated from the upstream document reads it, through
the real app: by default only records whose type and keyUpdateType are upstream's, each
valid against upstream's Activity schema, paged with cursors, nextCursor and totalCount
that count what the filter returns; ``include=keysvc`` lists every record, keysvc's
additions too; and keysvc's own OpenAPI document describes the parameter."""

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.api.rotation import rotate
from tests.api.webhooks import create_webhook, hooks_url
from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    create_creds,
    create_role,
)

UPSTREAM = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "upstream-keys-openapi.json").read_text()
)
ACTIVITY = UPSTREAM["components"]["schemas"]["Activity"]
UPSTREAM_TYPES = set(ACTIVITY["properties"]["type"]["enum"])
UPSTREAM_UPDATES = set(ACTIVITY["properties"]["keyUpdateType"]["enum"])


def url(creds: Creds, query: str = "") -> str:
    return f"/v1/organizations/{creds.organization_id}/activities?{query}"


async def pages(client: Client, creds: Creds, query: str, limit: int) -> list[dict[str, Any]]:
    """Every page of the list with ``query``, checking that each page's totalCount is
    the number of records the whole walk finds."""
    found: list[dict[str, Any]] = []
    totals: set[int] = set()
    cursor = ""
    while True:
        params = f"limit={limit}{query}" + (f"&cursor={cursor}" if cursor else "")
        response = await client.get(url(creds, params), headers=creds.headers)
        body = await response.json()
        assert response.status == 200, body
        assert len(body["result"]) <= limit
        found += body["result"]
        totals.add(body["totalCount"])
        if body["nextCursor"] is None:
            assert totals == {len(found)}
            assert len({a["id"] for a in found}) == len(found)
            return found
        assert len(body["result"]) == limit
        cursor = body["nextCursor"]


def upstream_kind(activity: dict[str, Any]) -> bool:
    update = activity.get("keyUpdateType")
    return activity["type"] in UPSTREAM_TYPES and (update is None or update in UPSTREAM_UPDATES)


async def every_kind(client: Client, admin: Creds) -> None:
    """Records of every type keysvc writes, upstream's and its own, interleaved."""
    org = f"/v1/organizations/{admin.organization_id}"
    one = await create_creds(client, admin, {"name": "one", "roles": ["developer"]})
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    limited = {"rateLimit": {"limit": 5, "windowSeconds": 10}}
    await assert_ok(await client.patch(f"{org}/keys/{one.id}", json=limited, headers=admin.headers))
    await assert_ok(
        await client.patch(f"{org}/keys/{one.id}", json={"name": "o"}, headers=admin.headers)
    )
    two = await create_creds(client, admin, {"name": "two", "roles": ["developer"]})
    await rotate(client, admin, two)
    hook = await create_webhook(
        client, admin, {"url": "http://93.184.215.14/hooks", "events": ["key.deleted"]}
    )
    await assert_ok(await client.delete(f"{org}/roles/{role['id']}", headers=admin.headers))
    disabled = {"state": "disabled"}
    await assert_ok(
        await client.patch(f"{org}/keys/{one.id}", json=disabled, headers=admin.headers)
    )
    assert (await client.get("/v1/whoami", headers=one.headers)).status == 401
    await assert_ok(
        await client.delete(hooks_url(admin, hook["webhook"]["id"]), headers=admin.headers)
    )
    await create_creds(client, admin, {"name": "three", "roles": ["developer"]})
    for _ in range(200):  # key_used_after_revoke is written after the answer
        everything = await pages(client, admin, "&include=keysvc", 250)
        if any(a["type"] == "key_used_after_revoke" for a in everything):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("key_used_after_revoke was not recorded")


async def test_a_default_page_holds_only_what_upstream_s_schema_allows(
    client: Client, admin: Creds
) -> None:
    await every_kind(client, admin)
    everything = await pages(client, admin, "&include=keysvc", 250)
    kinds = {(a["type"], a.get("keyUpdateType")) for a in everything}
    assert {
        ("role_create", None), ("role_delete", None), ("webhook_create", None),
        ("webhook_delete", None), ("key_used_after_revoke", None),
        ("openapi_key_update", "key-rotated"), ("openapi_key_update", "rate-limit-changed"),
    } <= kinds  # fmt: skip
    expected = [a for a in everything if upstream_kind(a)]
    assert 0 < len(expected) < len(everything)
    for limit in (1, 2, 3, 250):
        default = await pages(client, admin, "", limit)
        assert default == expected
    for activity in default:
        jsonschema.validate(activity, ACTIVITY)


async def test_dates_and_the_filter_count_together(client: Client, admin: Creds) -> None:
    await every_kind(client, admin)
    everything = await pages(client, admin, "&include=keysvc", 250)
    middle = everything[len(everything) // 2]["createdAt"]
    since = f"&from_date={middle}"
    later = [a for a in everything if a["createdAt"] >= middle]
    assert await pages(client, admin, since + "&include=keysvc", 2) == later
    assert await pages(client, admin, since, 2) == [a for a in later if upstream_kind(a)]


async def test_a_cursor_of_one_view_pages_the_other_correctly(client: Client, admin: Creds) -> None:
    """A cursor stands for a place in the log, so a cursor of the full list continues
    the default one after that place, with nothing repeated."""
    await every_kind(client, admin)
    everything = await pages(client, admin, "&include=keysvc", 250)
    response = await client.get(url(admin, "limit=4&include=keysvc"), headers=admin.headers)
    body = await response.json()
    assert body["result"] == everything[:4]
    rest = await client.get(url(admin, f"cursor={body['nextCursor']}"), headers=admin.headers)
    assert (await rest.json())["result"] == [a for a in everything[4:] if upstream_kind(a)]


@pytest.mark.parametrize("value", ["", "all", "KEYSVC", "keysvc,keysvc"])
async def test_an_unknown_include_is_refused(client: Client, admin: Creds, value: str) -> None:
    response = await client.get(url(admin, f"include={value}"), headers=admin.headers)
    await assert_error(response, 400, "include: must be keysvc, for keysvc's activity types too")


async def test_the_document_describes_include_and_the_extra_values(client: Client) -> None:
    document = await (await client.get("/v1/openapi.json")).json()
    operation = document["paths"]["/v1/organizations/{organizationId}/activities"]["get"]
    (include,) = [p for p in operation["parameters"] if p["name"] == "include"]
    assert include["in"] == "query" and include["schema"]["enum"] == ["keysvc"]
    assert include["x-keysvc-addition"] is True
    activity = document["components"]["schemas"]["Activity"]["properties"]
    for added in ("role_create", "webhook_create", "webhook_delete", "key_used_after_revoke"):
        assert added in activity["type"]["x-keysvc-enum-additions"]
    assert "key-rotated" in activity["keyUpdateType"]["x-keysvc-enum-additions"]


async def test_the_console_asks_for_every_record(client: Client) -> None:
    page = await (await client.get("/console")).text()
    (folder,) = {link.rsplit("/", 1)[0] for link in page.split('"') if "/assets/" in link}
    script = await (await client.get(f"/{folder.lstrip('/')}/activities.js")).text()
    assert 'include: "keysvc"' in script
