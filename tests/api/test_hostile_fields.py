"""The hostile input corpus: the fields of a body (names, IP lists, long lists,
expireAt, field names of thousands of digits). Every case gets a 4xx envelope naming
the problem, never a 500, a plain-text answer or a hang."""

import json
from typing import Any

import pytest

from keysvc.config import MAX_BODY_BYTES
from tests.api.hostile import (
    BODY_ENDPOINTS,
    SURROGATE,
    TOO_LARGE,
    Targets,
    expect_error,
    org_url,
    send,
)
from tests.helpers import (
    FAR_FUTURE,
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
    create_creds,
)

# Fields.

GOOD_NAMES = {
    "rtl-hebrew": "\u05de\u05e4\u05ea\u05d7 \u05e8\u05d0\u05e9\u05d9",
    "rtl-arabic": "\u0645\u0641\u062a\u0627\u062d \u0627\u0644\u0625\u0646\u062a\u0627\u062c",
    "emoji": "\U0001f511 deploy \U0001f680",
    "combining-marks": "Z\u0351\u036b\u0343a\u0310\u0301l\u0357g\u030fo",
    "cjk": "\u672c\u756a\u74b0\u5883\u306e\u30ad\u30fc",
    "255-emoji": "\U0001f511" * 255,
    "sql-looking": "'; drop table api_keys; --",
    "html": "<script>alert(1)</script>",
}


@pytest.mark.parametrize("name", GOOD_NAMES.values(), ids=GOOD_NAMES.keys())
async def test_unicode_names_are_stored_exactly(
    client: Client, targets: Targets, name: str
) -> None:
    """Names are text, whatever the script: stored and read back code point for code point."""
    admin = targets.admin
    created = (await create(client, admin, {"name": name, "roles": ["developer"]}))["key"]
    assert created["name"] == name
    got = await assert_ok(
        await client.get(org_url(admin, f"/keys/{created['id']}"), headers=admin.headers)
    )
    assert got["name"] == name
    listed = await assert_ok(await client.get(org_url(admin, "/keys"), headers=admin.headers))
    assert name in [key["name"] for key in listed]
    patched = await send(client, targets, "patch-key", json={"name": name})
    assert (await assert_ok(patched))["name"] == name
    role = await send(client, targets, "create-role", json={"name": name})
    assert (await assert_ok(role))["name"] == name
    renamed = await send(client, targets, "patch-role", json={"name": "x" + name[1:]})
    assert (await assert_ok(renamed))["name"] == "x" + name[1:]


INVISIBLE = "name: must not contain invisible or formatting characters such as"
BAD_NAMES = {
    "nul": ("\x00", "name: must not contain control characters"),
    "nul-inside": ("a\x00b", "name: must not contain control characters"),
    "escape": ("a\x1b[31mred", "name: must not contain control characters"),
    "delete": ("a\x7fb", "name: must not contain control characters"),
    "c1-control": ("a\x9bb", "name: must not contain control characters"),
    "newline": ("a\nb", "name: must not contain control characters"),
    "bidi-override": ("invoice\u202egpj.exe", f"{INVISIBLE} U+202E"),
    "zwj-sequence": ("\U0001f469\u200d\U0001f4bb on-call", f"{INVISIBLE} U+200D"),
    "only-whitespace": ("\u3000 \t", "name: must be 1 to 255 characters"),
    "256-emoji": ("\U0001f511" * 256, "name: must be 1 to 255 characters"),
    "lone-surrogate": ("\ud800", f"name: {SURROGATE}"),
    "number": (7, "name: must be a string"),
    "array": (["a"], "name: must be a string"),
    "object": ({"a": 1}, "name: must be a string"),
    "null": (None, "name: must not be null"),
}


@pytest.mark.parametrize("case", BAD_NAMES)
async def test_bad_names_are_400(client: Client, targets: Targets, case: str) -> None:
    name, message = BAD_NAMES[case]
    for endpoint in BODY_ENDPOINTS:
        body: dict[str, Any] = {"name": name}
        if endpoint == "create-key":
            body["roles"] = ["developer"]
        response = await send(client, targets, endpoint, json=body)
        await expect_error(response, 400, message, endpoint)


def _ip_list(count: int) -> list[dict[str, str]]:
    return [{"source": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"} for n in range(count)]


KEY_BODY_ENDPOINTS = ["create-key", "patch-key"]


def key_body(endpoint: str, **fields: Any) -> dict[str, Any]:
    base = {"name": "k", "roles": ["developer"]} if endpoint == "create-key" else {}
    return {**base, **fields}


@pytest.mark.parametrize("endpoint", KEY_BODY_ENDPOINTS)
async def test_ten_thousand_ip_entries(client: Client, targets: Targets, endpoint: str) -> None:
    """10,000 real entries do not fit in a body; 10,000 tiny ones do, and are refused
    by the list limit in one message, not ten thousand."""
    big = await send(
        client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(10_000))
    )
    await assert_error(big, 413, TOO_LARGE)
    tiny = json.dumps(key_body(endpoint, ipAccessList=[{}] * 10_000)).encode()
    assert len(tiny) < MAX_BODY_BYTES
    response = await send(
        client, targets, endpoint, data=tiny, headers={"Content-Type": "application/json"}
    )
    await assert_error(response, 400, "ipAccessList: must have at most 100 entries")


@pytest.mark.parametrize("endpoint", KEY_BODY_ENDPOINTS)
async def test_ip_list_limit_boundary(client: Client, targets: Targets, endpoint: str) -> None:
    over = await send(
        client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(101))
    )
    await assert_error(over, 400, "ipAccessList: must have at most 100 entries")
    at = await send(client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(100)))
    result = await assert_ok(at)
    stored = result["key"] if endpoint == "create-key" else result
    assert stored["ipAccessList"] == _ip_list(100)


LONG_LISTS = {
    "assignedRoleIds": (
        "create-key",
        {"name": "k", "assignedRoleIds": ["x"] * 10_000},
        "assignedRoleIds: must have at most 100 entries",
    ),
    "role-permissions": (
        "create-role",
        {"name": "r", "permissions": [1] * 10_000},
        "permissions: must have at most 100 entries",
    ),
    "role-policies": (
        "create-role",
        {"name": "r", "policies": [1] * 10_000},
        "policies: must have at most 100 entries",
    ),
    "role-actors": (
        "patch-role",
        {"actors": [1] * 10_000},
        "actors: must have at most 1000 entries",
    ),
}


@pytest.mark.parametrize("case", LONG_LISTS)
async def test_long_lists_get_one_message(client: Client, targets: Targets, case: str) -> None:
    endpoint, body, message = LONG_LISTS[case]
    response = await send(client, targets, endpoint, json=body)
    await assert_error(response, 400, message)


async def test_many_bad_entries_get_a_bounded_answer(client: Client, targets: Targets) -> None:
    """Under every list limit, still many errors: the answer lists ten, in order."""
    sources = [{"source": "bad"}] * 100
    response = await send(
        client, targets, "create-key", json=key_body("create-key", ipAccessList=sources)
    )
    one = "must be an IPv4 or IPv6 address or CIDR"
    listed = "; ".join(f"ipAccessList.{n}.source: {one}" for n in range(10))
    await assert_error(response, 400, f"{listed}; and 90 more")


async def test_lone_surrogate_deep_in_the_body_is_named(client: Client, targets: Targets) -> None:
    """Caught wherever it is (it would otherwise be stored, or fail the insert)."""
    entry = b'{"source": "10.0.0.0/8", "description": "office \\udc00"}'
    for endpoint in KEY_BODY_ENDPOINTS:
        body = b'{"name": "k", "roles": ["developer"], "ipAccessList": [' + entry + b"]}"
        response = await send(
            client, targets, endpoint, data=body, headers={"Content-Type": "application/json"}
        )
        message = f"ipAccessList.0.description: {SURROGATE}"
        await expect_error(response, 400, message, endpoint)


ZONE_IDS = ["fe80::1%eth0", "fe80::1%1", "fe80::%25eth0/64", "fe80::1%", "::1%lo/128"]


@pytest.mark.parametrize("source", ZONE_IDS)
async def test_ipv6_zone_ids_are_refused(client: Client, targets: Targets, source: str) -> None:
    for endpoint in KEY_BODY_ENDPOINTS:
        body = key_body(endpoint, ipAccessList=[{"source": source}])
        response = await send(client, targets, endpoint, json=body)
        message = "ipAccessList.0.source: must not carry an IPv6 zone ID"
        await expect_error(response, 400, message, endpoint)


BAD_EXPIRE_AT = {
    "year-0001": ("0001-01-01T00:00:00Z", "expireAt: must be in the future"),
    "year-0001-with-offset": ("0001-01-01T00:00:00+01:00", "expireAt: is out of range"),
    "year-9999-behind-utc": ("9999-12-31T23:59:59-01:00", "expireAt: is out of range"),
    "year-10000": (
        "10000-01-01T00:00:00Z",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "no-timezone": (
        "2099-01-01T00:00:00",
        "expireAt: must include a time zone offset, such as Z or +02:00",
    ),
    "date-only": ("2099-01-01", "expireAt: must include a time zone offset, such as Z or +02:00"),
    "offset-24h": (
        "2099-01-01T00:00:00+24:00",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "month-13": (
        "2099-13-01T00:00:00Z",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "epoch-number": (4102444800, "expireAt: must be an ISO-8601 date-time string, null or empty"),
    "sql": (
        "2099-01-01' or '1'='1",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
}


@pytest.mark.parametrize("case", BAD_EXPIRE_AT)
async def test_bad_expire_at_is_400(client: Client, targets: Targets, case: str) -> None:
    value, message = BAD_EXPIRE_AT[case]
    for endpoint in KEY_BODY_ENDPOINTS:
        response = await send(client, targets, endpoint, json=key_body(endpoint, expireAt=value))
        await expect_error(response, 400, message, endpoint)


@pytest.mark.parametrize(
    ("sent", "answered"),
    [
        ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"),
        ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"),
        ("9999-12-31T23:59:59+00:00", "9999-12-31T23:59:59Z"),
        ("9999-12-31T22:00:00-01:00", "9999-12-31T23:00:00Z"),
    ],
)
async def test_year_9999_is_stored_read_and_compared(
    client: Client, targets: Targets, sent: str, answered: str
) -> None:
    """The latest expiry there is: no overflow when it is stored, read, listed,
    compared at authentication, or changed."""
    admin = targets.admin
    body = {"name": "far", "roles": ["admin"], "expireAt": sent}
    far = await create_creds(client, admin, body)
    got = await assert_ok(
        await client.get(org_url(admin, f"/keys/{far.id}"), headers=admin.headers)
    )
    assert got["expireAt"] == answered
    listed = await assert_ok(await client.get(org_url(admin, "/keys"), headers=far.headers))
    assert answered in [key["expireAt"] for key in listed]
    response = await client.get("/v1/verify", headers=far.headers)
    assert response.status == 200
    patched = await client.patch(
        org_url(admin, f"/keys/{far.id}"), json={"name": "far 2"}, headers=far.headers
    )
    assert (await assert_ok(patched))["expireAt"] == answered
    moved = await client.patch(
        org_url(admin, f"/keys/{far.id}"), json={"expireAt": FAR_FUTURE}, headers=admin.headers
    )
    assert (await assert_ok(moved))["expireAt"] == FAR_FUTURE


async def test_field_and_parameter_names_of_thousands_of_digits(
    client: Client, admin: Creds
) -> None:
    """Error messages are sorted by their numbers without int(): no 500 past Python's
    4,300-digit conversion limit; and a client's field name is quoted cut short."""
    digits = "1" * 5000
    keys = f"/v1/organizations/{admin.organization_id}/keys"
    response = await client.get(f"{keys}?{digits}=1", headers=admin.headers)
    assert response.status == 400
    response = await client.post(
        keys,
        data=f'{{"name": "a", "{digits}": 1}}',
        headers={**admin.headers, "Content-Type": "application/json"},
    )
    body = await assert_error(response, 400, f"{digits[:64]}: is not a known field")
    assert digits[:65] not in body["error"]
