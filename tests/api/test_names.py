"""Names and descriptions hold only characters shown as themselves: no format characters
(bidi controls, zero-width characters, tags...), separators, grapheme joiner or Hangul
fillers, refused as control characters are, on every path that takes them."""

import re
import unicodedata
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from keysvc.http import schemas
from tests.helpers import Client, Creds, assert_error, assert_ok, create, create_role

# Bidi embeddings and overrides, bidi isolates, zero-width space, non-joiner and joiner,
# the left-to-right and right-to-left marks, word joiner, and the byte order mark.
# Then the soft hyphen, the combining grapheme joiner, a Hangul filler, an interlinear
# annotation anchor, and a tag (beyond the Basic Multilingual Plane).
HIDDEN = [
    *range(0x202A, 0x202F), *range(0x2066, 0x206A), *range(0x200B, 0x2010), 0x2060, 0xFEFF,
    0x00AD, 0x034F, 0x3164, 0xFFF9, 0xE0061,
]  # fmt: skip


def _code(code: int) -> str:
    return f"U+{code:04X}"


def _refusal(field: str, code: int) -> str:
    return f"{field}: must not contain invisible or formatting characters such as {_code(code)}"


async def _bodies(client: Client, admin: Creds, text: str) -> list[tuple[str, str, Any, str]]:
    """(method, URL, body, field) for every field that takes a name or a description."""
    keys = f"/v1/organizations/{admin.organization_id}/keys"
    roles = f"/v1/organizations/{admin.organization_id}/roles"
    key = (await create(client, admin, {"name": "target", "roles": ["developer"]}))["key"]
    role = await create_role(client, admin, {"name": "target", "permissions": ["reports:read"]})
    entry = {"source": "10.0.0.0/8", "description": text}
    return [
        ("POST", keys, {"name": text, "roles": ["developer"]}, "name"),
        ("PATCH", f"{keys}/{key['id']}", {"name": text}, "name"),
        ("POST", roles, {"name": text}, "name"),
        ("PATCH", f"{roles}/{role['id']}", {"name": text}, "name"),
        ("POST", keys, {"name": "k", "roles": ["developer"], "ipAccessList": [entry]},
         "ipAccessList.0.description"),
        ("PATCH", f"{keys}/{key['id']}", {"ipAccessList": [entry]}, "ipAccessList.0.description"),
    ]  # fmt: skip


@pytest.mark.parametrize("code", HIDDEN, ids=_code)
@pytest.mark.parametrize("where", ["leading", "inside"])
async def test_hidden_characters_are_refused(
    client: Client, admin: Creds, code: int, where: str
) -> None:
    text = chr(code) + "admin" if where == "leading" else f"ad{chr(code)}min"
    keys = f"/v1/organizations/{admin.organization_id}/keys"
    roles = f"/v1/organizations/{admin.organization_id}/roles"
    for method, url, body, field in await _bodies(client, admin, text):
        response = await client.request(method, url, json=body, headers=admin.headers)
        await assert_error(response, 400, _refusal(field, code))
    listed_keys = await assert_ok(await client.get(keys, headers=admin.headers))
    assert {key["name"] for key in listed_keys} == {"acme admin", "target"}
    assert all(key["ipAccessList"] == [] for key in listed_keys)
    listed_roles = await assert_ok(await client.get(roles, headers=admin.headers))
    assert [role["name"] for role in listed_roles if role["type"] == "custom"] == ["target"]


async def test_the_first_hidden_character_is_named(client: Client, admin: Creds) -> None:
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/roles",
        json={"name": "a\u200db\u202ec"},
        headers=admin.headers,
    )
    await assert_error(response, 400, _refusal("name", 0x200D))


async def test_shown_text_is_still_taken(client: Client, admin: Creds) -> None:
    """Right-to-left scripts and emoji need no hidden character, and stay accepted."""
    for name in ("\u05de\u05e4\u05ea\u05d7", "\U0001f511 deploy", "caf\u00e9"):
        role = await create_role(client, admin, {"name": name})
        assert role["name"] == name


def test_the_class_holds_every_format_character_of_the_plane() -> None:
    """INVISIBLE, which the document's patterns use, holds every character of the Basic
    Multilingual Plane that the check refuses by category (Cf, Zl, Zp)."""
    pattern = re.compile(f"[{schemas.INVISIBLE}]")
    missed = [
        f"U+{code:04X}"
        for code in range(0x10000)
        if not 0xD800 <= code <= 0xDFFF
        and unicodedata.category(chr(code)) in ("Cf", "Zl", "Zp")
        and not pattern.match(chr(code))
    ]
    assert missed == []


# The document's patterns hold the plane's characters (JSON Schema's regular
# expressions name no character beyond it the same way); the check refuses all.
@pytest.mark.parametrize("code", [code for code in HIDDEN if code <= 0xFFFF], ids=_code)
async def test_the_document_refuses_them_too(client: Client, code: int) -> None:
    """The OpenAPI document says what keysvc accepts: its name and description patterns
    refuse the same characters, and still allow names around them."""
    spec = await assert_ok_document(client)
    schemas = spec["components"]["schemas"]
    for schema in (
        schemas["ApiKeyPostRequest"]["properties"]["name"],
        schemas["RoleCreateRequest"]["properties"]["name"],
        schemas["IpAccessListEntry"]["properties"]["description"],
    ):
        validator = Draft202012Validator(schema)
        assert validator.is_valid("admin")
        assert not validator.is_valid(chr(code) + "admin")
        assert not validator.is_valid(f"ad{chr(code)}min")


async def assert_ok_document(client: Client) -> dict[str, Any]:
    response = await client.get("/v1/openapi.json")
    assert response.status == 200
    document: dict[str, Any] = await response.json()
    return document
