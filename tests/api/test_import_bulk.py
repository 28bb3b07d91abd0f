"""Issue 37's import speed, through the real app: a batch's keys are counted, placed
and granted as one create at a time would have them (on SQLite a batch does the row
triggers' work in one statement each, dropping them inside its transaction and making
them again from their own text), and a key ID that another key's rotation replaced
is still refused, as the dropped check refused it."""

import secrets
from typing import Any

import pytest

from keysvc.config import Settings
from tests.api.importing import import_keys, record
from tests.handsql import hand_sql, hand_value
from tests.helpers import (
    Client,
    Creds,
    assert_ok,
    create,
    create_role,
    hash_data,
    keys_url,
    write_sql,
)

# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default).
pytestmark = pytest.mark.settings(api_token_import=True)

TRIGGERS = "select name, sql from sqlite_schema where type = 'trigger' order by name"


# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default,
# tests/api/test_import_tokens_off.py).
pytestmark = pytest.mark.settings(api_token_import=True)


def _counts(settings: Settings, organization_id: str) -> tuple[int, int, int]:
    """The organization's (key_count, last_key_seq) and the authorization generation."""
    ((count, last),) = hand_sql(
        settings,
        "select key_count, last_key_seq from organizations where id = ?",
        organization_id,
    )
    generation = hand_value(settings, "select value from meta where name = 'auth_generation'")
    return int(count), int(last), int(generation)


def _stored(settings: Settings, organization_id: str) -> tuple[int, int]:
    ((count, last),) = hand_sql(
        settings,
        "select count(*), max(org_seq) from api_keys where organization_id = ?",
        organization_id,
    )
    return int(count), int(last)


async def test_a_batch_counts_places_and_grants_its_keys_as_the_triggers_do(
    client: Client, admin: Creds, settings: Settings
) -> None:
    org = admin.organization_id
    role = await create_role(client, admin, {"name": "reader", "permissions": ["keys:read"]})
    count, last, generation = _counts(settings, org)
    token = secrets.token_urlsafe(24)
    records: list[Any] = [
        record("two-roles", assignedRoleIds=[role["id"]]),
        record("one-role", token=token),
        record("repeat", token=token),  # refused: the token of the record before
        record("plain"),
    ]
    result = await import_keys(client, admin, records)
    assert result["imported"] == 3 and [e["index"] for e in result["errors"]] == [2]
    # Three keys; four key_roles rows (developer on each, reader on the first).
    assert _counts(settings, org) == (count + 3, last + 3, generation + 4)
    assert _stored(settings, org) == (count + 3, last + 3)
    # A create after it takes the next place; a delete is counted out.
    made = await create(client, admin, {"name": "after", "roles": ["developer"]})
    assert _counts(settings, org)[:2] == (count + 4, last + 4)
    gone = result["keys"][0]["id"]
    await assert_ok(await client.delete(keys_url(admin, gone), headers=admin.headers))
    assert _counts(settings, org)[:2] == (count + 3, last + 4)
    assert _stored(settings, org) == (count + 3, last + 4)
    assert made["key"]["id"] != gone


async def test_a_key_id_that_a_rotation_replaced_is_refused(client: Client, admin: Creds) -> None:
    key_id, secret = "old" + secrets.token_hex(8), "s3cret-" + secrets.token_hex(16)
    made = await create(
        client,
        admin,
        {"name": "rotated", "roles": ["developer"], "hashData": hash_data(key_id, secret)},
    )
    new_id = "new" + secrets.token_hex(8)
    body = {
        "gracePeriodSeconds": 3600,
        "hashData": hash_data(new_id, "s3cret-" + secrets.token_hex(16)),
    }
    url = keys_url(admin, made["key"]["id"]) + "/rotate"
    await assert_ok(await client.post(url, json=body, headers=admin.headers))
    base = {"importId": "takes-old", "name": "takes-old", "roles": ["developer"]}
    result = await import_keys(client, admin, [{**base, "hashData": hash_data(key_id, secret)}])
    assert result["imported"] == 0
    assert [(e["index"], e["error"]) for e in result["errors"]] == [
        (0, "hashData.keyIdHash: a key with this key ID already exists")
    ]


@pytest.mark.sqlite_only  # SQLite's row triggers, in its file's schema
async def test_a_batch_does_the_row_triggers_work_once_and_makes_them_again(
    client: Client, admin: Creds, settings: Settings
) -> None:
    before = hand_sql(settings, TRIGGERS)
    version = hand_value(settings, "pragma schema_version")
    result = await import_keys(client, admin, [record(f"k{n}") for n in range(3)])
    assert result["imported"] == 3
    # The triggers were dropped and made again in the batch's transaction (the schema's
    # version moved), each from its own text.
    assert hand_value(settings, "pragma schema_version") > version
    assert hand_sql(settings, TRIGGERS) == before


@pytest.mark.sqlite_only  # SQLite's row triggers, in its file's schema
async def test_a_trigger_not_as_expected_is_left_to_fire_for_each_row(
    client: Client, admin: Creds, settings: Settings
) -> None:
    # The same work written otherwise (a later schema's, or an operator's): the batch
    # does not know it, and leaves it to fire.
    write_sql(settings.db_path, "drop trigger api_keys_counted")
    write_sql(
        settings.db_path,
        """create trigger api_keys_counted after insert on api_keys begin
            update organizations set key_count = 1 + key_count,
                                     last_key_seq = max(new.org_seq, last_key_seq)
            where id = new.organization_id;
        end""",
    )
    org = admin.organization_id
    count, last, generation = _counts(settings, org)
    version = hand_value(settings, "pragma schema_version")
    result = await import_keys(client, admin, [record(f"k{n}") for n in range(3)])
    assert result["imported"] == 3
    assert hand_value(settings, "pragma schema_version") == version
    assert _counts(settings, org) == (count + 3, last + 3, generation + 3)
