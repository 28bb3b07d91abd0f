"""A webhook URL's address in one of IANA's special-purpose ranges, through the real
app: refused at create whatever Python's ``is_global`` says of it (deprecated
site-local, documentation, benchmarking, shared address space, discard-only), while
ordinary public addresses of both families are still accepted."""

import pytest

from tests.api.webhooks import PRIVATE, hooks_url
from tests.helpers import Client, Creds, assert_error, assert_ok

SPECIAL = [
    "[fec0::1]",  # deprecated site-local, fec0::/10
    "[feff:ffff::1]",  # the end of fec0::/10
    "[3fff::1]",  # documentation, 3fff::/20
    "[3fff:fff:ffff::1]",  # the end of 3fff::/20
    "[2001:db8::1]",  # documentation, 2001:db8::/32
    "[2001:20::1]",  # ORCHIDv2, inside the IETF protocol assignments 2001::/23
    "[100::1]",  # discard-only, 100::/64
    "[fc00::1]",  # unique local
    "[5f00::1]",  # segment routing identifiers
    "[4000::1]",  # outside global unicast 2000::/3
    "[64:ff9b:1::a00:1]",  # local-use NAT64 of 10.0.0.1
    "192.0.2.1",  # documentation, TEST-NET-1
    "198.51.100.1",  # TEST-NET-2
    "203.0.113.1",  # TEST-NET-3
    "198.18.0.1",  # benchmarking
    "100.64.0.1",  # shared address space (carrier-grade NAT)
    "240.0.0.1",  # reserved
    "255.255.255.255",  # limited broadcast
]
PUBLIC = ["93.184.215.14", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]", "[2a00:1450:4001::1]"]


async def post_hook(client: Client, admin: Creds, url: str) -> object:
    body = {"url": url, "events": ["key.created"]}
    return await client.post(hooks_url(admin), json=body, headers=admin.headers)


@pytest.mark.parametrize("address", SPECIAL)
async def test_special_purpose_addresses_are_refused(
    client: Client, admin: Creds, address: str
) -> None:
    response = await post_hook(client, admin, f"http://{address}/hooks")
    await assert_error(response, 400, PRIVATE.format(address.strip("[]")))
    assert await assert_ok(await client.get(hooks_url(admin), headers=admin.headers)) == []


@pytest.mark.parametrize("address", PUBLIC)
async def test_public_addresses_are_still_accepted(
    client: Client, admin: Creds, address: str
) -> None:
    await assert_ok(await post_hook(client, admin, f"http://{address}/hooks"))
