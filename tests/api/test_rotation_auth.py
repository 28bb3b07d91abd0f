"""A rotated key's previous credentials as authentication sees them: cached with their
own end, refused at that end exactly as an unknown key is (answer, metrics reason,
database reads), and the rotation as the OpenAPI document and the renderer describe it."""

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
from jsonschema import Draft202012Validator

from keysvc.config import Settings
from keysvc.credentials import new_key_id, new_secret
from keysvc.http import render
from keysvc.http.responses import ApiKeySchema
from keysvc.http.state import HASHER, STORE
from keysvc.models import Key, Role
from tests.api.refusals import invalid_credentials, refusal
from tests.api.rotation import post_rotate, rotate, rotated_away, works
from tests.handsql import hand_sql, hand_value
from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    count_reads,
    create_creds,
)

ROTATE_PATH = "/v1/organizations/{organizationId}/keys/{keyId}/rotate"


async def test_an_ended_previous_credential_is_refused_as_rotated_not_as_invalid(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    """Its own answer and metrics reason; with a wrong secret, the old key ID answers
    and counts as an unknown one does."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 30})
    assert await works(client, svc)
    clock.advance(seconds=30)
    unknown = Creds(svc.organization_id, svc.id, new_key_id(), new_secret())
    wrong = Creds(svc.organization_id, svc.id, svc.key_id, new_secret())
    before = await invalid_credentials(client)
    rotated_before = await invalid_credentials(client, "rotated")
    assert await rotated_away(client, svc)
    assert await invalid_credentials(client) == before
    assert await invalid_credentials(client, "rotated") == rotated_before + 1
    assert await refusal(client, wrong) == await refusal(client, unknown)
    assert await invalid_credentials(client) == before + 2


async def test_a_cached_previous_credential_ends_without_any_invalidation(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    """The cache entry carries its own end: nothing is committed at the grace end, and
    the credential, cached and proven, is refused from that instant."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 30})
    store, hasher = client.app[STORE], client.app[HASHER]
    for _ in range(3):  # the first read caches it; the next ones go by the header's proof
        assert await works(client, svc)
    cached = store.caches.cached_credential(hasher.of_plain(svc.key_id))
    assert cached is not None and cached.until == clock.now + timedelta(seconds=30)
    generation = store.caches.generation
    clock.advance(seconds=29.9)
    assert await works(client, svc)
    clock.advance(seconds=0.1)
    assert await rotated_away(client, svc)
    assert store.caches.generation == generation  # no invalidation did it
    assert store.caches.cached_credential(hasher.of_plain(svc.key_id)) is not None


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
async def test_an_ended_previous_key_id_with_a_wrong_secret_costs_the_reads_of_an_unknown_key(
    client: Client,
    admin: Creds,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    cached: bool,
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 30})
    assert await works(client, svc)  # cached now
    clock.advance(seconds=31)
    store = client.app[STORE]
    unknown = Creds(svc.organization_id, svc.id, new_key_id(), new_secret())
    wrong = Creds(svc.organization_id, svc.id, svc.key_id, new_secret())
    statements = count_reads(store, monkeypatch)
    await refusal(client, unknown)
    unknown_reads = list(statements)
    statements.clear()
    if not cached:
        store.caches.credentials.clear()
    await refusal(client, wrong)
    assert statements == unknown_reads and len(unknown_reads) == 1


async def test_a_refreshed_record_keeps_each_credential_its_own_secret(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the key by its UUID refreshes its cached record under both key IDs; the
    previous key ID must not take the current secret with it (or the other way)."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    new, _ = await rotate(client, admin, svc, {"gracePeriodSeconds": 600})
    # Both cached, the previous key ID last (the one a key's UUID was last seen under).
    assert await works(client, new) and await works(client, svc)
    store = client.app[STORE]
    generation = store.caches.generation
    # A commit that changes no authorization (a create puts the generation back), then
    # a read of the key by its UUID: its cached record is refreshed, under both key IDs.
    await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    refreshed = 0
    original = store.caches.credentials.refresh

    def counting(key: Key, data_version: int) -> None:
        nonlocal refreshed
        refreshed += 1
        original(key, data_version)

    monkeypatch.setattr(store.caches.credentials, "refresh", counting)
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    assert (await client.get(url, headers=admin.headers)).status == 200
    assert refreshed == 1 and store.caches.generation == generation
    mixed = [
        Creds(svc.organization_id, svc.id, svc.key_id, new.secret),
        Creds(svc.organization_id, svc.id, new.key_id, svc.secret),
    ]
    for creds in mixed:
        assert not await works(client, creds)
    assert await works(client, svc) and await works(client, new)


# How an operator ends a grace period by hand, column by column.
HAND_EDITS = (
    "update api_keys set previous_until = '2000-01-01T00:00:00Z' where id = ?",
    "update api_keys set previous_secret_hash = null where id = ?",
    "update api_keys set previous_key_id_hash = null where id = ?",
)


async def test_hand_edits_of_previous_credentials_move_the_generation(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """An operator who ends a grace period by hand (docs/SECURITY.md) is seen at once:
    the schema's trigger moves auth_generation, which drops every credential cache."""
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    await rotate(client, admin, svc, {"gracePeriodSeconds": 600})
    assert await works(client, svc)
    generation = "select cast(value as integer) from meta where name = 'auth_generation'"
    for edit in HAND_EDITS:
        before = hand_value(settings, generation)
        hand_sql(settings, edit, svc.id)
        assert hand_value(settings, generation) == before + 1, edit
        if edit == HAND_EDITS[0]:
            assert await rotated_away(client, svc)
    # Its hashes gone by hand, with no tombstone kept: an unknown key ID's answer.
    assert not await works(client, svc)


def test_the_renderer_shows_the_previous_credentials_end_as_the_schema_does() -> None:
    role_at = datetime(2026, 1, 2, tzinfo=UTC)
    role = Role("0b5d3c8e-0000-4000-8000-000000000001", "developer", "system", ("keys:read",),
                role_at, role_at)  # fmt: skip
    base = Key(
        id="7d7c1b0e-3f43-4c1e-9d0b-4c7e2c1f0a11", seq=1,
        organization_id="6a0f6f35-2f7c-4a57-a0e5-5f7b4f3f0c22", name="k", state="enabled",
        key_suffix="x9Z2", created_at=role_at, expire_at=None, used_at=None,
        ip_access_list=[], roles=(role,), rate_limit=(5, 60),
    )  # fmt: skip
    for until in (
        datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC),
        datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    ):
        key = dataclasses.replace(base, previous_until=until)
        expected = ApiKeySchema().dump(key)
        assert render.api_key(key) == expected and list(render.api_key(key)) == list(expected)
        assert render.key_json(key) == json.dumps(expected)
        assert "previousCredentialExpiresAt" in expected
    assert "previousCredentialExpiresAt" not in render.api_key(base)


async def test_the_document_describes_rotation(client: Client, admin: Creds) -> None:
    document = await (await client.get("/v1/openapi.json")).json()
    operation = document["paths"][ROTATE_PATH]["post"]
    assert operation["operationId"] == "keysvcKeyRotate"
    assert operation["requestBody"]["required"] is False
    assert {"200", "400", "401", "403", "404", "409", "429", "507"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    grace = schemas["ApiKeyRotateRequest"]["properties"]["gracePeriodSeconds"]
    assert (grace["minimum"], grace["maximum"]) == (0, 30 * 86_400)
    added = schemas["ApiKey"]["properties"]["previousCredentialExpiresAt"]
    assert added["x-keysvc-addition"] is True and added["format"] == "date-time"

    def validator(status: int) -> Draft202012Validator:
        content = operation["responses"][str(status)]["content"]["application/json"]
        return Draft202012Validator({**content["schema"], "components": document["components"]})

    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    for status, response in (
        (200, await post_rotate(client, admin, svc.id, {"gracePeriodSeconds": 5})),
        (400, await post_rotate(client, admin, svc.id, {"gracePeriodSeconds": -5})),
        (404, await post_rotate(client, admin, "5f3c2a1b-0000-4000-8000-000000000000")),
    ):
        assert response.status == status
        body = await response.json()
        assert not list(validator(status).iter_errors(body)), body
