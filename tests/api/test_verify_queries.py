"""Permission queries on verify (issue 36): X-Required-Permission and ?permission= take
names joined by AND and OR with parentheses; not met is a 403, malformed a 400."""

import pytest

from tests.helpers import Client, Creds, assert_error, create_creds, create_role

VERIFY = "/v1/verify"
POLICY = "reports:read AND (region:eu OR region:any)"


async def key_with(client: Client, admin: Creds, *permissions: str) -> Creds:
    name = "svc-" + "-".join(p.replace(":", ".").replace("*", "all") for p in permissions)
    role = await create_role(client, admin, {"name": name, "permissions": list(permissions)})
    return await create_creds(client, admin, {"name": "k", "assignedRoleIds": [role["id"]]})


@pytest.mark.parametrize(
    ("granted", "allowed"),
    [
        (["reports:read", "region:eu"], True),
        (["reports:read", "region:any"], True),
        (["reports:*", "region:*"], True),
        (["reports:read"], False),
        (["region:eu"], False),
        (["reports:read", "region:us"], False),
    ],
)
async def test_a_query_is_met_in_the_header_and_in_the_query_string(
    client: Client, admin: Creds, granted: list[str], allowed: bool
) -> None:
    key = await key_with(client, admin, *granted)
    for response in (
        await client.get(VERIFY, headers={**key.headers, "X-Required-Permission": POLICY}),
        await client.get(VERIFY, headers=key.headers, params={"permission": POLICY}),
    ):
        if allowed:
            assert response.status == 200, await response.text()
            assert response.headers["X-Key-Id"] == key.id
        else:
            await assert_error(
                response, 403, f"this key does not meet the permission query {POLICY}"
            )


async def test_and_binds_tighter_than_or(client: Client, admin: Creds) -> None:
    key = await key_with(client, admin, "b:y")
    response = await client.get(
        VERIFY, params={"permission": "a:x OR b:y AND c:z"}, headers=key.headers
    )
    await assert_error(
        response, 403, "this key does not meet the permission query a:x OR b:y AND c:z"
    )
    key = await key_with(client, admin, "b:y", "c:z")
    response = await client.get(
        VERIFY, params={"permission": "a:x OR b:y AND c:z"}, headers=key.headers
    )
    assert response.status == 200


async def test_a_query_in_the_header_and_one_in_the_query_must_both_be_met(
    client: Client, admin: Creds
) -> None:
    """A client's header (forwarded by a proxy) cannot replace the proxy's query."""
    key = await key_with(client, admin, "reports:read", "region:eu")
    weaker = {**key.headers, "X-Required-Permission": "reports:read OR admin:all"}
    response = await client.get(VERIFY, headers=weaker, params={"permission": "billing:read"})
    await assert_error(response, 403, "this key lacks the permission billing:read")
    response = await client.get(VERIFY, headers=weaker, params={"permission": POLICY})
    assert response.status == 200


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("a:x AND", "permission: the query ends where a permission name or ( was expected"),
        ("reports:read AND (region:eu", "permission: the ( at character 18 is never closed"),
        ("reports:read region:eu", "permission: unexpected region:eu at character 14"),
        ("(" * 9 + "a:x" + ")" * 9, "permission: more than 8 nested parentheses at character 9"),
        (" OR ".join(f"a:x{i}" for i in range(33)),
         "permission: more than 32 permission names (at character 279)"),
        ("a:" + "x" * 1100, "permission: a query may be at most 1024 characters"),
    ],
)  # fmt: skip
async def test_a_malformed_query_is_a_400_that_says_where(
    client: Client, admin: Creds, query: str, message: str
) -> None:
    response = await client.get(VERIFY, headers=admin.headers, params={"permission": query})
    await assert_error(response, 400, message)
