"""What the rotation tests (tests/api/test_rotation*.py) share: the rotate request,
and whether credentials authenticate, or are refused as a rotated key's old pair."""

from typing import Any

from tests.helpers import ROTATED, UNAUTHORIZED, Client, Creds, assert_error, assert_ok


def rotate_url(caller: Creds, key_uuid: str) -> str:
    return f"/v1/organizations/{caller.organization_id}/keys/{key_uuid}/rotate"


async def post_rotate(
    client: Client, caller: Creds, key_uuid: str, body: dict[str, Any] | None = None
) -> Any:
    """The rotate request's response; with no ``body``, no body at all."""
    url = rotate_url(caller, key_uuid)
    if body is None:
        return await client.post(url, headers=caller.headers)
    return await client.post(url, json=body, headers=caller.headers)


async def rotate(
    client: Client, caller: Creds, target: Creds, body: dict[str, Any] | None = None
) -> tuple[Creds, dict[str, Any]]:
    """Rotate ``target``'s key; its new credentials, and the rotated key."""
    result = await assert_ok(await post_rotate(client, caller, target.id, body))
    assert set(result) == {"key", "keyId", "keySecret"}
    assert result["key"]["id"] == target.id
    new = Creds(target.organization_id, target.id, result["keyId"], result["keySecret"])
    return new, result["key"]


async def works(client: Client, creds: Creds) -> bool:
    """Whether ``creds`` authenticate; any refusal must be the unknown key's answer."""
    response = await client.get("/v1/whoami", headers=creds.headers)
    if response.status == 200:
        assert (await response.json())["result"]["id"] == creds.id
        return True
    await assert_error(response, 401, UNAUTHORIZED)
    return False


async def rotated_away(client: Client, creds: Creds) -> bool:
    """Whether ``creds`` are refused as a rotated key's replaced pair; if they are not,
    they must authenticate."""
    response = await client.get("/v1/whoami", headers=creds.headers)
    if response.status == 200:
        assert (await response.json())["result"]["id"] == creds.id
        return False
    await assert_error(response, 401, ROTATED)
    return True
