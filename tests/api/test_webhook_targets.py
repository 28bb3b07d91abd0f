"""A webhook URL's host through the real app: a malformed one (bad IDNA, empty or
over-long labels, ``%``) is no URL, a 400 and never a 500; an address that wraps a
non-public IPv4 one (6to4, Teredo) or lies in a range Python's ``is_global`` lets
through is refused at create and again at delivery."""

import pytest

from keysvc.config import Settings
from tests.api.webhooks import PRIVATE, attempted, create_webhook, hooks_url, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create,
)
from tests.receiver import Receiver

NOT_A_URL = "url: is not a URL; give one such as https://example.com/hooks"
# 6to4 and Teredo addresses of loopback, the metadata address and a private network,
# and IPv4 ranges that are not private to Python yet reach no public host.
WRAPPED = [
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
]
RESERVED_V4 = ["192.0.0.8", "192.0.0.255", "192.88.99.1"]


async def post_hook(client: Client, admin: Creds, url: str) -> object:
    body = {"url": url, "events": ["key.created"]}
    return await client.post(hooks_url(admin), json=body, headers=admin.headers)


@pytest.mark.parametrize(
    "host",
    [
        "xn--",  # an empty punycode label
        "xn--.example.com",
        "\uff58\uff4e--.example.com",  # full-width x and n, folded to xn--
        "xn--a.example.com",  # punycode that decodes to nothing valid
        "xn--zz-.example.com",  # punycode that does not round-trip
        "a..example.com",  # an empty label
        ".example.com",
        ".",
        "a。。example.com",  # unicode full stops that fold into an empty label
        "a" * 64 + ".example.com",  # a label over 63 characters
        ".".join(["a" * 63] * 4) + ".com",  # a name over 253 characters
        "exa%6dple.com",  # % in a name
        "93.184.215.14%25.internal.example",  # % after an IPv4 address: no zone ID
        "%",
    ],
)
async def test_malformed_hosts_are_not_urls(client: Client, admin: Creds, host: str) -> None:
    await assert_error(await post_hook(client, admin, f"https://{host}/hooks"), 400, NOT_A_URL)
    assert await assert_ok(await client.get(hooks_url(admin), headers=admin.headers)) == []


@pytest.mark.parametrize("address", [f"[{a}]" for a in WRAPPED] + RESERVED_V4)
async def test_wrapped_and_reserved_addresses_are_refused(
    client: Client, admin: Creds, address: str
) -> None:
    response = await post_hook(client, admin, f"http://{address}/hooks")
    await assert_error(response, 400, PRIVATE.format(address.strip("[]")))


async def test_a_6to4_address_of_a_public_one_is_accepted(client: Client, admin: Creds) -> None:
    await assert_ok(await post_hook(client, admin, "http://[2002:5db8:d70e::]/hooks"))


async def test_an_ipv6_zone_id_is_left_out_of_the_judgement(client: Client, admin: Creds) -> None:
    response = await post_hook(client, admin, "http://[fe80::1%25eth0]/hooks")
    await assert_error(response, 400, PRIVATE.format("fe80::1%25eth0"))


@pytest.mark.parametrize("address", ["[2002:7f00:1::]", "192.0.0.8"])
async def test_delivery_refuses_them_too(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    address: str,
) -> None:
    """A webhook made while private targets were allowed is refused at delivery once they
    are not, without a connection attempt (that would time out)."""
    client = await private_client(aiohttp_client, settings, clock, webhook_timeout=2.0)
    admin = await bootstrap(client.app)
    url = f"http://{address}:{receiver.port}/hooks"
    created = await create_webhook(client, admin, {"url": url, "events": ["key.created"]})
    await client.close()
    client = await private_client(
        aiohttp_client, settings, clock, webhook_allow_private=False, webhook_timeout=2.0
    )
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    log = await attempted(client, admin, created["webhook"]["id"])
    assert [(a["status"], a["error"]) for a in log[0]["attempts"]] == [(None, "blocked_address")]
    assert receiver.received == []
