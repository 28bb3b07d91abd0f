"""What the activity tests share: the activity list's URL, and every activity of an
organization read through the list's pages."""

from typing import Any

from tests.helpers import Client, Creds


def url(creds: Creds, rest: str = "") -> str:
    return f"/v1/organizations/{creds.organization_id}/activities{rest}"


async def listed(client: Client, creds: Creds, query: str = "") -> list[dict[str, Any]]:
    """Every activity of the organization, through the pages."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = f"?limit=2&include=keysvc{query}" + (f"&cursor={cursor}" if cursor else "")
        response = await client.get(url(creds, params), headers=creds.headers)
        body = await response.json()
        assert response.status == 200, body
        found += body["result"]
        cursor = body["nextCursor"]
        if cursor is None:
            return found


async def key_updates(client: Client, creds: Creds, key_id: str) -> list[tuple[str, Any, Any]]:
    """The key's update records, keysvc's own included: (keyUpdateType, before, after)."""
    records = await listed(client, creds)
    return [
        (r["keyUpdateType"], r["before"], r["after"])
        for r in records
        if r.get("targetKeyId") == key_id and r["type"] == "openapi_key_update"
    ]
