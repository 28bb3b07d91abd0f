"""The hand-written key answers (keysvc.http.render) are exactly what the marshmallow
schemas dump, and the envelopes byte for byte what json.dumps makes of the body."""

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from keysvc.http import envelope, render
from keysvc.http.responses import ApiKeySchema, CreateKeyResultSchema
from keysvc.http.state import STORE
from keysvc.models import Key
from tests.helpers import Client, Creds, create, create_role, hash_data
from tests.records import CUSTOM, KEYS, SYSTEM, key


@pytest.mark.parametrize("value", KEYS)
def test_api_key_is_what_the_schema_dumps(value: Key) -> None:
    expected = ApiKeySchema().dump(value)
    made = render.api_key(value)
    assert made == expected
    assert list(made) == list(expected)  # the same fields in the same order
    assert render.key_json(value) == json.dumps(expected)


def test_a_list_is_what_the_schema_dumps() -> None:
    assert render.keys_json(KEYS) == json.dumps(ApiKeySchema(many=True).dump(KEYS))
    assert render.keys_json([]) == "[]"


def test_the_text_is_made_once_per_key_and_never_outlives_it() -> None:
    first = key()
    assert render.key_json(first) is render.key_json(first)
    renamed = dataclasses.replace(first, name="renamed")
    assert json.loads(render.key_json(renamed))["name"] == "renamed"
    assert json.loads(render.key_json(first))["name"] == first.name
    same = dataclasses.replace(first)  # a new record, equal to the first: no text yet
    assert same == first and render._MEMO not in vars(same)  # the kept text is no field


def test_the_envelope_is_what_json_dumps_makes() -> None:
    result = ApiKeySchema().dump(KEYS[-1])
    text = envelope.envelope("a-request-id", render.key_json(KEYS[-1]), ', "totalCount": 3')
    assert text == json.dumps(
        {"status": 200, "requestId": "a-request-id", "result": result, "totalCount": 3}
    )
    page = render.keys_json(KEYS).encode()
    body = envelope.envelope_bytes("a-request-id", page, b', "totalCount": 3')
    assert body == json.dumps(
        {
            "status": 200,
            "requestId": "a-request-id",
            "result": [ApiKeySchema().dump(k) for k in KEYS],
            "totalCount": 3,
        }
    ).encode("utf-8")


async def answered(client: Client, method: str, url: str, creds: Creds, **kw: Any) -> Any:
    response = await client.request(method, url, headers=creds.headers, **kw)
    text = await response.text()
    assert response.status == 200, text
    assert response.content_type == "application/json" and response.charset == "utf-8"
    return response, text, json.loads(text)["requestId"]


async def test_answers_are_byte_for_byte_the_schemas(client: Client, admin: Creds) -> None:
    """Create, read, update and list through the app; each answer's bytes against what
    the marshmallow schemas dump from the stored keys."""
    org = admin.organization_id
    url = f"/v1/organizations/{org}/keys"
    role = await create_role(client, admin, {"name": "ops", "permissions": ["reports:read"]})
    body = {
        "name": "full \u00e9",
        "assignedRoleIds": [role["id"]],
        "roles": ["developer"],
        "expireAt": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
        "ipAccessList": [{"source": "127.0.0.0/8", "description": "loopback"}],
        "rateLimit": {"limit": 50, "windowSeconds": 10},
    }
    store = client.app[STORE]

    response, text, request_id = await answered(client, "POST", url, admin, json=body)
    made = json.loads(text)["result"]
    stored = await store.get_key(org, made["key"]["id"])
    assert stored is not None
    expected = {"key": stored, "keyId": made["keyId"], "keySecret": made["keySecret"]}
    dumped = CreateKeyResultSchema().dump(expected)
    assert text == json.dumps({"status": 200, "requestId": request_id, "result": dumped})

    hashed = {"name": "own", "roles": ["developer"], "hashData": hash_data("own-key-id", "s")}
    response, text, request_id = await answered(client, "POST", url, admin, json=hashed)
    own = await store.get_key(org, json.loads(text)["result"]["key"]["id"])
    dumped = CreateKeyResultSchema().dump({"key": own})
    assert text == json.dumps({"status": 200, "requestId": request_id, "result": dumped})

    one = f"{url}/{stored.id}"
    response, text, request_id = await answered(client, "GET", one, admin)
    stored = await store.get_key(org, stored.id)
    assert stored is not None
    result = ApiKeySchema().dump(stored)
    assert text == json.dumps({"status": 200, "requestId": request_id, "result": result})
    assert response.headers["ETag"] == stored.etag

    response, text, request_id = await answered(
        client, "PATCH", one, admin, json={"name": "renamed", "rateLimit": None}
    )
    stored = await store.get_key(org, stored.id)
    assert stored is not None and stored.name == "renamed"
    result = ApiKeySchema().dump(stored)
    assert text == json.dumps({"status": 200, "requestId": request_id, "result": result})
    assert response.headers["ETag"] == stored.etag

    await create(client, admin, {"name": "third", "roles": ["developer"]})
    for query in ("", "?limit=2"):
        response, text, request_id = await answered(client, "GET", url + query, admin)
        listed = json.loads(text)
        page = await store.list_keys(org, 0, 2 if query else 100)
        assert text == json.dumps(
            {
                "status": 200,
                "requestId": request_id,
                "result": ApiKeySchema(many=True).dump(page.keys),
                "nextCursor": listed["nextCursor"],
                "totalCount": page.total,
            }
        )
        assert (listed["nextCursor"] is None) == (not query)


def test_the_permissions_header_is_sorted_and_kept() -> None:
    both = key(roles=(CUSTOM, SYSTEM))
    assert render.permissions_header(both) == "keys:read,reports:read"
    assert render.permissions_header(both) is render.permissions_header(both)
    assert render.permissions_header(key(roles=())) == ""
