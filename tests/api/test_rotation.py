"""Key rotation (POST .../keys/{keyId}/rotate): new credentials for the same key, the
old ones kept for a grace period, who may rotate what, and the refusals."""

import json
from datetime import timedelta
from typing import Any

import pytest

from keysvc.credentials import new_key_id, new_secret
from keysvc.domain.keys import DISABLED, EXPIRED, ROTATED_BY_PREVIOUS, STRONGER_KEY
from keysvc.http.schemas import MAX_GRACE_SECONDS
from keysvc.http.state import STORE
from keysvc.timeutil import from_text, to_text
from tests.api.rotation import post_rotate, rotate, rotate_url, rotated_away, works
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    create,
    create_creds,
    create_role,
    hash_data,
)


async def test_rotation_gives_new_credentials_and_keeps_the_rest(
    client: Client, admin: Creds
) -> None:
    role = await create_role(client, admin, {"name": "reports", "permissions": ["reports:read"]})
    svc = await create_creds(client, admin, {
        "name": "svc", "roles": ["developer"], "assignedRoleIds": [role["id"]],
        "expireAt": "2099-01-01T00:00:00Z", "rateLimit": {"limit": 5, "windowSeconds": 60},
        "ipAccessList": [{"source": "127.0.0.0/8", "description": "here"}],
    })  # fmt: skip
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    before = await assert_ok(await client.get(url, headers=admin.headers))
    new, rotated = await rotate(client, admin, svc)
    assert new.key_id != svc.key_id and new.secret != svc.secret
    # Everything but the credentials' suffix is as it was; no grace, so no previous ones.
    assert rotated == {**before, "keySuffix": new.key_id[-4:]}
    assert await assert_ok(await client.get(url, headers=admin.headers)) == rotated
    assert await works(client, new)
    assert await rotated_away(client, svc)


async def test_no_body_and_an_empty_body_mean_no_grace(client: Client, admin: Creds) -> None:
    for body in (None, {}):
        svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
        new, rotated = await rotate(client, admin, svc, body)
        assert "previousCredentialExpiresAt" not in rotated
        assert await rotated_away(client, svc)
        assert await works(client, new)


async def test_old_credentials_work_until_the_grace_period_ends(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    new, rotated = await rotate(client, admin, svc, {"gracePeriodSeconds": 60})
    end = clock.now + timedelta(seconds=60)
    assert rotated["previousCredentialExpiresAt"] == to_text(end)
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    shown = await assert_ok(await client.get(url, headers=admin.headers))
    assert shown["previousCredentialExpiresAt"] == to_text(end)
    assert shown["keySuffix"] == new.key_id[-4:]
    assert await works(client, svc) and await works(client, new)
    clock.advance(seconds=59.999)
    assert await works(client, svc) and await works(client, new)
    clock.advance(seconds=0.001)
    assert await rotated_away(client, svc)
    assert await works(client, new)
    # Still shown, now in the past: when the old credentials stopped working.
    shown = await assert_ok(await client.get(url, headers=admin.headers))
    assert from_text(shown["previousCredentialExpiresAt"]) == end


async def test_old_and_new_halves_never_mix(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    new, _ = await rotate(client, admin, svc, {"gracePeriodSeconds": 600})
    assert await works(client, svc) and await works(client, new)
    for key_id, secret in ((svc.key_id, new.secret), (new.key_id, svc.secret)):
        assert not await works(client, Creds(svc.organization_id, svc.id, key_id, secret))


async def test_a_second_rotation_ends_the_first_grace_at_once(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    first = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    second, _ = await rotate(client, admin, first, {"gracePeriodSeconds": 3600})
    assert await works(client, first)
    third, rotated = await rotate(client, admin, second, {"gracePeriodSeconds": 60})
    assert rotated["previousCredentialExpiresAt"] == to_text(clock.now + timedelta(seconds=60))
    assert await rotated_away(client, first)
    assert await works(client, second) and await works(client, third)
    # A rotation without grace ends the one running, and shows none.
    fourth, rotated = await rotate(client, admin, third)
    assert "previousCredentialExpiresAt" not in rotated
    assert [await rotated_away(client, c) for c in (first, second, third)] == [True] * 3
    assert await works(client, fourth)


async def test_the_grace_period_ends_with_the_key(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    expiry = clock.now + timedelta(seconds=90)
    svc = await create_creds(
        client, admin, {"name": "svc", "roles": ["developer"], "expireAt": to_text(expiry)}
    )
    _, rotated = await rotate(client, admin, svc, {"gracePeriodSeconds": 3600})
    assert rotated["previousCredentialExpiresAt"] == rotated["expireAt"] == to_text(expiry)


async def test_client_chosen_credentials(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    own = Creds(svc.organization_id, svc.id, "my-own-key-id-0001", "my own secret")
    response = await post_rotate(
        client, admin, svc.id, {"hashData": hash_data(own.key_id, own.secret)}
    )
    result = await assert_ok(response)
    assert set(result) == {"key"}  # nothing echoed: the client chose them
    assert result["key"]["keySuffix"] == "0001"
    assert await works(client, own)
    assert await rotated_away(client, svc)


async def test_a_key_id_in_use_is_refused(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    other = await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    kept, _ = await rotate(client, admin, other, {"gracePeriodSeconds": 600})
    taken = "hashData.keyIdHash: a key with this key ID already exists"
    # Another key's current key ID, its previous one in grace, and the key's own.
    for key_id in (kept.key_id, other.key_id, svc.key_id):
        body = {"hashData": hash_data(key_id, new_secret())}
        await assert_error(await post_rotate(client, admin, svc.id, body), 409, taken)
    assert await works(client, svc) and await works(client, other) and await works(client, kept)


async def test_a_new_key_cannot_take_a_replaced_key_id(client: Client, admin: Creds) -> None:
    """Its old credentials still answer to it: a create may not take it over."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 600})
    body = {"name": "thief", "roles": ["developer"], "hashData": hash_data(svc.key_id, "s")}
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys", json=body, headers=admin.headers
    )
    await assert_error(response, 409, "hashData.keyIdHash: a key with this key ID already exists")
    assert await works(client, svc)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gracePeriodSeconds": -1}, "must be an integer from 0 to 2592000 (30 days)"),
        ({"gracePeriodSeconds": MAX_GRACE_SECONDS + 1}, "must be an integer from 0 to 2592000"),
        ({"gracePeriodSeconds": "60"}, "Not a valid integer."),
        ({"gracePeriodSeconds": True}, "Not a valid integer."),
        ({"gracePeriodSeconds": 1.5}, "Not a valid integer."),
        ({"gracePeriodSeconds": None}, "must not be null"),
        ({"name": "renamed"}, "is not a known field"),
        ({"hashData": {}}, "hashData.keyIdHash: is required"),
        ({"hashData": {"keyIdHash": "", "keyIdSuffix": "abcd", "keySecretHash": ""}},
         "hashData.keyIdHash: Not a sha256sum"),
    ],
)  # fmt: skip
async def test_bad_bodies_are_refused(
    client: Client, admin: Creds, body: dict[str, Any], message: str
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    response = await post_rotate(client, admin, svc.id, body)
    error = (await response.json())["error"]
    assert response.status == 400 and message in error, error
    assert await works(client, svc)


async def test_the_longest_grace_period_is_accepted(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    _, rotated = await rotate(client, admin, svc, {"gracePeriodSeconds": MAX_GRACE_SECONDS})
    end = clock.now + timedelta(days=30)
    assert rotated["previousCredentialExpiresAt"] == to_text(end)


async def test_a_disabled_or_expired_key_is_refused_with_what_to_do(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    disabled = await create(client, admin, {"name": "off", "roles": ["developer"],
                                            "state": "disabled"})  # fmt: skip
    await assert_error(await post_rotate(client, admin, disabled["key"]["id"]), 409, DISABLED)
    expiring = await create(client, admin, {
        "name": "soon", "roles": ["developer"], "expireAt": to_text(clock.now + timedelta(hours=1)),
    })  # fmt: skip
    clock.advance(hours=1)
    await assert_error(await post_rotate(client, admin, expiring["key"]["id"]), 409, EXPIRED)
    url = f"/v1/organizations/{admin.organization_id}/keys/{disabled['key']['id']}"
    assert (await assert_ok(await client.get(url, headers=admin.headers)))["keySuffix"] == (
        disabled["keyId"][-4:]
    )


async def test_unknown_key_and_other_organizations(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    missing = "5f3c2a1b-0000-4000-8000-000000000000"
    await assert_error(
        await post_rotate(client, admin, missing), 404, "key not found in this organization"
    )
    theirs = await create_creds(client, other_admin, {"name": "theirs", "roles": ["developer"]})
    # Their key through our organization's path is unknown here; their path is not ours.
    await assert_error(
        await post_rotate(client, admin, theirs.id), 404, "key not found in this organization"
    )
    response = await client.post(rotate_url(other_admin, theirs.id), headers=admin.headers)
    await assert_error(response, 403, "this key does not belong to the organization in the path")
    assert await works(client, theirs)


async def test_rotation_needs_keys_update_and_a_key_no_stronger(
    client: Client, admin: Creds
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    target = await create_creds(client, admin, {"name": "t", "roles": ["developer"]})
    await assert_error(
        await post_rotate(client, dev, target.id), 403, "this key lacks the permission keys:update"
    )
    rotator_role = await create_role(
        client,
        admin,
        {"name": "rotator", "permissions": ["keys:update", "keys:create", "keys:read"]},
    )
    rotator = await create_creds(
        client, admin, {"name": "rotator", "assignedRoleIds": [rotator_role["id"]]}
    )
    # An admin key is stronger than the rotator; a developer key is not.
    await assert_error(await post_rotate(client, rotator, admin.id), 403, STRONGER_KEY)
    assert await works(client, admin)
    await assert_error(await post_rotate(client, rotator, dev.id), 403, STRONGER_KEY)
    dev_role = await create_role(client, admin, {"name": "reader", "permissions": ["keys:read"]})
    weak = await create_creds(client, admin, {"name": "weak", "assignedRoleIds": [dev_role["id"]]})
    new, _ = await rotate(client, rotator, weak)
    assert await works(client, new) and await rotated_away(client, weak)


async def test_a_key_rotates_itself_with_its_current_credentials_only(
    client: Client, admin: Creds
) -> None:
    """Self-rotation changes no access, so a key may do it; but one authenticated with its
    previous credentials may not, or their holder would outlive the grace period."""
    auto = await create_creds(client, admin, {"name": "automation", "roles": ["admin"]})
    second, _ = await rotate(client, auto, auto, {"gracePeriodSeconds": 600})
    assert await works(client, auto) and await works(client, second)
    response = await post_rotate(client, auto, auto.id, {"gracePeriodSeconds": 600})
    await assert_error(response, 403, ROTATED_BY_PREVIOUS)
    assert await works(client, auto) and await works(client, second)
    # With its current credentials it may, and that ends the previous ones at once.
    third, _ = await rotate(client, second, second, {"gracePeriodSeconds": 600})
    assert await rotated_away(client, auto)
    assert await works(client, second) and await works(client, third)


async def test_previous_credentials_rotate_other_keys_as_the_current_ones_would(
    client: Client, admin: Creds
) -> None:
    ops = await create_creds(client, admin, {"name": "ops", "roles": ["admin"]})
    current, _ = await rotate(client, admin, ops, {"gracePeriodSeconds": 600})
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    new, _ = await rotate(client, ops, svc)  # ops's previous credentials
    assert await works(client, new) and await works(client, current)


async def test_each_answer_is_a_fresh_secret_never_stored(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    new, _ = await rotate(client, admin, svc, {"gracePeriodSeconds": 60})
    assert new.secret.startswith("keysvc_") and len(new.key_id) == len(new_key_id())
    raw = await client.app[STORE].reader.execute_fetchall("select * from api_keys")
    dumped = json.dumps([[str(v) for v in row] for row in raw])
    for plain in (new.key_id, new.secret, svc.key_id, svc.secret):
        assert plain not in dumped


async def test_unknown_credentials_still_fail(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 60})
    assert not await works(client, Creds(svc.organization_id, svc.id, new_key_id(), new_secret()))
    response = await client.get("/v1/whoami", headers=basic(svc.key_id, new_secret()))
    await assert_error(response, 401, UNAUTHORIZED)
