"""Every rule of the create body: each violation is a 400 naming the field."""

from typing import Any

import pytest

from keysvc.credentials import sha256_b64
from tests.helpers import Client, Creds, assert_error

GOOD_HASH = sha256_b64("x")
HASH_DATA = {"keyIdHash": GOOD_HASH, "keyIdSuffix": "abcd", "keySecretHash": GOOD_HASH}


def body(**fields: Any) -> dict[str, Any]:
    return {"name": "k", "roles": ["admin"], **fields}


BAD_BODIES = [
    ({"roles": ["admin"]}, "name: is required"),
    (body(name=""), "name: must be 1 to 255 characters"),
    (body(name="   "), "name: must be 1 to 255 characters"),
    (body(name="x" * 256), "name: must be 1 to 255 characters"),
    (body(name="a\x00b"), "name: must not contain control characters"),
    (body(name="a\nb"), "name: must not contain control characters"),
    (body(name=7), "name: must be a string"),
    (body(name=None), "name: must not be null"),
    (body(colour="red"), "colour: is not a known field"),
    (body(state="paused"), "state: must be one of: enabled, disabled"),
    (body(roles=[]), "roles: must contain at least 1 element"),
    (body(roles=["root"]), "roles.0: must be one of: admin, developer, query_endpoints"),
    (body(roles="admin"), "roles: must be an array"),
    (body(assignedRoleIds=["nope"]), "assignedRoleIds.0: must be a role UUID"),
    (body(assignedRoleIds=["0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"] * 101),
     "assignedRoleIds: must have at most 100 entries"),
    (body(expireAt="2001-01-01T00:00:00Z"), "expireAt: must be in the future"),
    (body(expireAt="2099-01-01T00:00:00"),
     "expireAt: must include a time zone offset, such as Z or +02:00"),
    (body(expireAt="tomorrow"),
     "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z"),
    (body(expireAt=4102444800), "expireAt: must be an ISO-8601 date-time string, null or empty"),
    (body(expireAt="0001-01-01T00:00:00+01:00"), "expireAt: is out of range"),
    (body(ipAccessList=[{"source": "10.0.0.1/8"}]),
     "ipAccessList.0.source: has host bits set; did you mean 10.0.0.0/8?"),
    (body(ipAccessList=[{"source": "2001:db8::1/32"}]),
     "ipAccessList.0.source: has host bits set; did you mean 2001:db8::/32?"),
    (body(ipAccessList=[{"source": "fe80::1%eth0"}]),
     "ipAccessList.0.source: must not carry an IPv6 zone ID"),
    (body(ipAccessList=[{"source": "example.com"}]),
     "ipAccessList.0.source: must be an IPv4 or IPv6 address or CIDR"),
    (body(ipAccessList=[{"source": "300.1.1.1"}]),
     "ipAccessList.0.source: must be an IPv4 or IPv6 address or CIDR"),
    (body(ipAccessList=[{"description": "no source"}]), "ipAccessList.0.source: is required"),
    (body(ipAccessList=[{"source": "10.0.0.0/8", "description": "d" * 256}]),
     "ipAccessList.0.description: must be at most 255 characters"),
    (body(ipAccessList=[{"source": "10.0.0.0/8", "port": 22}]),
     "ipAccessList.0.port: is not a known field"),
    (body(ipAccessList=[{"source": f"10.0.{i // 256}.{i % 256}"} for i in range(101)]),
     "ipAccessList: must have at most 100 entries"),
    (body(hashData={**HASH_DATA, "keyIdHash": ""}), "hashData.keyIdHash: Not a sha256sum"),
    (body(hashData={**HASH_DATA, "keySecretHash": "c2VjcmV0"}),
     "hashData.keySecretHash: Not a sha256sum"),
    (body(hashData={**HASH_DATA, "keyIdHash": GOOD_HASH.replace("=", "!")}),
     "hashData.keyIdHash: Not a sha256sum"),
    (body(hashData={**HASH_DATA, "keyIdSuffix": "abc"}),
     "hashData.keyIdSuffix: must be the last 4 characters of the key ID"),
    (body(hashData={"keyIdHash": GOOD_HASH}),
     "hashData.keyIdSuffix: is required; hashData.keySecretHash: is required"),
    (body(hashData="yes"), "hashData: must be an object"),
    ({"name": "", "roles": []},
     "name: must be 1 to 255 characters; roles: must contain at least 1 element"),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "message"), BAD_BODIES)
async def test_bad_create_body(
    client: Client, admin: Creds, payload: dict[str, Any], message: str
) -> None:
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys", json=payload, headers=admin.headers
    )
    await assert_error(response, 400, message)


BAD_RAW = [
    (b"", "application/json", 400, "body: is required; send a JSON object"),
    (b"[1, 2]", "application/json", 400, "body: must be a JSON object"),
    (b'"text"', "application/json", 400, "body: must be a JSON object"),
    (b"{", "application/json", 400,
     "body: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"),
    (b'{"name": "a", "name": "b"}', "application/json", 400,
     "body: field 'name' appears more than once"),
    (b'{"name": NaN}', "application/json", 400, "body: invalid JSON: NaN is not valid JSON"),
    (b'{"name": "\xff"}', "application/json", 400, "body: is not valid UTF-8"),
    (b"[" * 1000 + b"]" * 1000, "application/json", 400, "body: JSON is nested too deeply"),
    (b'{"name": "k"}', "text/plain", 415,
     "request body must be JSON: send Content-Type: application/json"),
    (b"x" * (64 * 1024 + 1), "application/json", 413,
     "request body too large: the limit is 65536 bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "content_type", "status", "message"), BAD_RAW)
async def test_bad_raw_body(
    client: Client, admin: Creds, raw: bytes, content_type: str, status: int, message: str
) -> None:
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys",
        data=raw,
        headers={**admin.headers, "Content-Type": content_type},
    )
    await assert_error(response, status, message)
