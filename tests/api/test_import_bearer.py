"""Issue 37's bearer tokens, through the real app on both backends: a key imported from
its token's SHA-256 authenticates with ``Authorization: Bearer <token>`` on the
management API and on /v1/verify, with every check a Basic key gets, and unknown or
wrong tokens fail as unknown Basic credentials do, counted as failed logins."""

import base64
import hashlib
import ipaddress
import secrets
from typing import Any

import pytest

from keysvc.config import Settings
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    get_key,
    keys_url,
)

# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default,
# tests/api/test_import_tokens_off.py).
pytestmark = pytest.mark.settings(api_token_import=True)

VERIFY = "/v1/verify"


def token_hash(token: str, encoding: str = "hex") -> dict[str, str]:
    digest = hashlib.sha256(token.encode()).digest()
    value = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    return {"algorithm": "sha256", "encoding": encoding, "value": value}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def import_token(client: Client, admin: Creds, token: str, **fields: Any) -> dict[str, Any]:
    """Import one key from ``token``'s hash; the import's result."""
    record = {
        "importId": fields.pop("importId", "imp-" + secrets.token_hex(4)),
        "name": "imported",
        "roles": ["developer"],
        "tokenHash": token_hash(token),
        **fields,
    }
    response = await client.post(
        keys_url(admin) + "/import", json={"keys": [record]}, headers=admin.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    assert result["errors"] == [], result
    return result


@pytest.mark.parametrize("encoding", ["hex", "base64"])
async def test_an_imported_token_authenticates_as_bearer_on_api_and_verify(
    client: Client, admin: Creds, encoding: str
) -> None:
    token = "sk_live_" + secrets.token_urlsafe(32)
    result = await import_token(
        client, admin, token, roles=["admin"], tokenHash=token_hash(token, encoding)
    )
    key_id = result["keys"][0]["id"]
    me = await client.get(keys_url(admin, key_id), headers=bearer(token))
    assert (await assert_ok(me))["id"] == key_id
    verified = await client.get(VERIFY, headers=bearer(token))
    assert verified.status == 200
    assert verified.headers["X-Key-Id"] == key_id
    assert verified.headers["X-Organization-Id"] == admin.organization_id


async def test_unknown_and_wrong_tokens_look_like_unknown_basic_credentials(
    client: Client, admin: Creds
) -> None:
    token = secrets.token_urlsafe(32)
    await import_token(client, admin, token)
    unknown_basic = await client.get(VERIFY, headers=basic("A" * 20, "keysvc_guess"))
    first = await assert_error(unknown_basic, 401, UNAUTHORIZED)
    for header in (bearer(token + "x"), bearer(secrets.token_urlsafe(32)), bearer(token[:-1])):
        wrong = await client.get(VERIFY, headers=header)
        body = await assert_error(wrong, 401, UNAUTHORIZED)
        assert body.keys() == first.keys()
        assert wrong.headers["WWW-Authenticate"] == unknown_basic.headers["WWW-Authenticate"]


async def test_wrong_tokens_count_as_failed_logins(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(
        aiohttp_client,
        settings,
        clock,
        auth_failures=3,
        trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),),
    )
    admin = await bootstrap(client.app)
    token = secrets.token_urlsafe(32)
    await import_token(client, admin, token)
    clock.now = clock.now.replace(second=0, microsecond=0)
    attacker = {"X-Forwarded-For": "198.51.100.66"}
    for _ in range(3):
        guess = {**bearer(secrets.token_urlsafe(32)), **attacker}
        await assert_error(await client.get(VERIFY, headers=guess), 401, UNAUTHORIZED)
    blocked = await client.get(VERIFY, headers={**bearer(token), **attacker})
    await assert_error(
        blocked, 429, "too many failed authentications from this address: retry in 60 s"
    )
    assert (await client.get(VERIFY, headers=bearer(token))).status == 200


async def test_a_bearer_key_gets_every_check_a_basic_key_gets(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    token = secrets.token_urlsafe(32)
    expire = clock.now.replace(microsecond=0) + __import__("datetime").timedelta(hours=1)
    result = await import_token(
        client,
        admin,
        token,
        expireAt=expire.isoformat().replace("+00:00", "Z"),
        rateLimit={"limit": 3, "windowSeconds": 60},
        credits={"remaining": 2},
    )
    key_id = result["keys"][0]["id"]
    # Permissions: a developer may read keys, not create them, nor pass reports:read.
    assert (await client.get(keys_url(admin), headers=bearer(token))).status == 200
    refused = await client.post(
        keys_url(admin), json={"name": "x", "roles": ["developer"]}, headers=bearer(token)
    )
    await assert_error(refused, 403, "this key lacks the permission keys:create")
    needs = await client.get(VERIFY, headers={**bearer(token), "X-Required-Permission": "a:b"})
    assert needs.status == 403
    # The request limit (3 a minute) is spent by the three requests above.
    limited = await client.get(VERIFY, headers=bearer(token))
    assert limited.status == 429
    clock.advance(seconds=61)
    # Credits: two verifies, then none left.
    assert (await client.get(VERIFY, headers=bearer(token))).headers["X-Credits-Remaining"] == "1"
    assert (await client.get(VERIFY, headers=bearer(token))).headers["X-Credits-Remaining"] == "0"
    assert (await client.get(VERIFY, headers=bearer(token))).status == 429
    # Usage counts its requests; usedAt is set.
    assert "usedAt" in await get_key(client, admin, key_id)
    # Expiry, then the state.
    clock.advance(hours=2)
    await assert_error(await client.get(VERIFY, headers=bearer(token)), 401, "key has expired")
    patched = await client.patch(
        keys_url(admin, key_id), json={"state": "disabled", "expireAt": None}, headers=admin.headers
    )
    await assert_ok(patched)
    await assert_error(await client.get(VERIFY, headers=bearer(token)), 401, "key is disabled")


async def test_a_bearer_key_outside_its_ip_list_is_refused(client: Client, admin: Creds) -> None:
    token = secrets.token_urlsafe(32)
    await import_token(client, admin, token, ipAccessList=[{"source": "203.0.113.0/24"}])
    refused = await client.get(VERIFY, headers=bearer(token))
    await assert_error(refused, 403, "client address not allowed for this key")


async def test_a_leaked_bearer_token_is_found_by_revoke_leaked(
    client: Client, admin: Creds
) -> None:
    token = secrets.token_urlsafe(32)
    key_id = (await import_token(client, admin, token))["keys"][0]["id"]
    await assert_ok(await client.post("/v1/keys/revoke-leaked", json={"secret": token}))
    for _ in range(100):
        if (await get_key(client, admin, key_id))["state"] == "disabled":
            break
        await __import__("asyncio").sleep(0.05)
    assert (await get_key(client, admin, key_id))["state"] == "disabled"
    await assert_error(await client.get(VERIFY, headers=bearer(token)), 401, "key is disabled")


async def test_a_keysvc_key_id_is_no_bearer_token(client: Client, admin: Creds) -> None:
    """The lookup hashes are apart: a key ID or secret sent as a token finds nothing."""
    for value in (admin.key_id, admin.secret):
        await assert_error(await client.get(VERIFY, headers=bearer(value)), 401, UNAUTHORIZED)
