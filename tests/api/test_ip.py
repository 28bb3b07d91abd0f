"""IP access lists through the app: allowed and denied keys, trusted proxies, forged
headers, and the sources a list keeps."""

import ipaddress

import pytest

from keysvc.config import Settings
from keysvc.credentials import new_secret
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create,
    create_creds,
)

DENIED = "client address not allowed for this key"
NETS = ipaddress.ip_network


async def restricted(client: Client, admin: Creds, *sources: str) -> Creds:
    body = {"name": "r", "roles": ["developer"], "ipAccessList": [{"source": s} for s in sources]}
    return await create_creds(client, admin, body)


def own(admin: Creds) -> str:
    return f"/v1/organizations/{admin.organization_id}/keys/{admin.id}"


async def test_allowed_and_denied_over_ipv4(client: Client, admin: Creds) -> None:
    allowed = await restricted(client, admin, "127.0.0.1")
    await assert_ok(await client.get(own(admin), headers=allowed.headers))
    denied = await restricted(client, admin, "10.0.0.0/8", "2001:db8::/32")
    await assert_error(await client.get(own(admin), headers=denied.headers), 403, DENIED)
    # An empty list is no restriction at all (not deny-all).
    open_key = await restricted(client, admin)
    await assert_ok(await client.get(own(admin), headers=open_key.headers))


async def test_forged_forwarded_for_from_untrusted_peer_changes_nothing(
    client: Client, admin: Creds
) -> None:
    key = await restricted(client, admin, "198.51.100.0/24")
    forged = {**key.headers, "X-Forwarded-For": "198.51.100.7"}
    await assert_error(await client.get(own(admin), headers=forged), 403, DENIED)


@pytest.fixture
async def proxied(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> tuple[Client, Creds]:
    client = await client_with(
        aiohttp_client, settings, clock, trusted_proxies=(NETS("127.0.0.0/8"),)
    )
    return client, await bootstrap(client.app)


async def test_trusted_proxy_forwarded_for_ipv4_and_ipv6(proxied: tuple[Client, Creds]) -> None:
    client, admin = proxied
    v4 = await restricted(client, admin, "198.51.100.0/24")
    v6 = await restricted(client, admin, "2001:db8::/32")
    through = {"X-Forwarded-For": "203.0.113.1, 198.51.100.7"}
    await assert_ok(await client.get(own(admin), headers={**v4.headers, **through}))
    await assert_error(await client.get(own(admin), headers={**v6.headers, **through}), 403, DENIED)
    v6_through = {"X-Forwarded-For": "2001:db8::5"}
    await assert_ok(await client.get(own(admin), headers={**v6.headers, **v6_through}))
    # No header: the client is the proxy itself, which this key does not allow.
    await assert_error(await client.get(own(admin), headers=v4.headers), 403, DENIED)


async def test_forwarded_for_over_several_lines_is_one_list(
    proxied: tuple[Client, Creds],
) -> None:
    """A proxy may append its own X-Forwarded-For line after the client's: the lines
    are one list, in order, so the client's forged first line is not the last hop."""
    client, admin = proxied
    key = await restricted(client, admin, "10.1.2.3/32")
    forged = [("X-Forwarded-For", "10.1.2.3"), ("X-Forwarded-For", "198.51.100.7")]
    response = await client.get(own(admin), headers=[*key.headers.items(), *forged])
    await assert_error(response, 403, DENIED)
    honest = [("X-Forwarded-For", "198.51.100.7"), ("X-Forwarded-For", "10.1.2.3")]
    await assert_ok(await client.get(own(admin), headers=[*key.headers.items(), *honest]))


async def test_ip_checked_only_after_the_secret(client: Client, admin: Creds) -> None:
    key = await restricted(client, admin, "10.0.0.0/8")
    # A well-formed wrong secret from outside the list: the secret decides first (401),
    # so a stranger learns nothing about the key's IP access list (it would be a 403).
    wrong = basic(key.key_id, new_secret())
    response = await client.get(own(admin), headers=wrong)
    assert response.status == 401


async def test_forwarded_for_hops_with_ports(proxied: tuple[Client, Creds]) -> None:
    """Hops written ``ip:port`` or ``[v6]:port`` name that client, not the proxy."""
    client, admin = proxied
    v4 = await restricted(client, admin, "198.51.100.0/24")
    v6 = await restricted(client, admin, "2001:db8::/32")
    for key, hop in ((v4, "198.51.100.7:52100"), (v6, "[2001:db8::5]:443"), (v6, "[2001:db8::5]")):
        headers = {**key.headers, "X-Forwarded-For": f"{hop}, 127.0.0.2:8080"}
        await assert_ok(await client.get(own(admin), headers=headers))
    # Junk still stops the walk at the proxy, which these keys do not allow.
    junk = {**v4.headers, "X-Forwarded-For": "198.51.100.7:99999"}
    await assert_error(await client.get(own(admin), headers=junk), 403, DENIED)


# Sources written in a form that ipaddress reads but that never matched as written,
# and the IPv4 form they are kept and shown in.
KEPT_SOURCES = {
    "::ffff:127.0.0.1": "127.0.0.1",
    "::ffff:127.0.0.0/104": "127.0.0.0/8",
    "::ffff:7f00:1/128": "127.0.0.1/32",
    "127.0.0.0/255.0.0.0": "127.0.0.0/8",
    "127.0.0.0/0.255.255.255": "127.0.0.0/8",
    "127.0.0.1/255.255.255.255": "127.0.0.1/32",
}


@pytest.mark.parametrize(("source", "kept"), KEPT_SOURCES.items(), ids=KEPT_SOURCES.keys())
async def test_mapped_and_mask_sources_are_kept_as_the_cidr_they_mean(
    client: Client, admin: Creds, source: str, kept: str
) -> None:
    """On create and on PATCH: the answer and a later GET show the kept form, and a
    request from the loopback address the source names is allowed."""
    created = await create(
        client,
        admin,
        {"name": "r", "roles": ["developer"], "ipAccessList": [{"source": source}]},
    )
    assert created["key"]["ipAccessList"] == [{"source": kept}]
    key = Creds(admin.organization_id, created["key"]["id"], created["keyId"], created["keySecret"])
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    assert (await assert_ok(await client.get(url, headers=admin.headers)))["ipAccessList"] == [
        {"source": kept}
    ]
    await assert_ok(await client.get(own(admin), headers=key.headers))
    elsewhere = {"ipAccessList": [{"source": "10.0.0.0/8"}]}
    await assert_ok(await client.patch(url, json=elsewhere, headers=admin.headers))
    await assert_error(await client.get(own(admin), headers=key.headers), 403, DENIED)
    back = {"ipAccessList": [{"source": source, "description": "loopback"}]}
    patched = await assert_ok(await client.patch(url, json=back, headers=admin.headers))
    assert patched["ipAccessList"] == [{"source": kept, "description": "loopback"}]
    await assert_ok(await client.get(own(admin), headers=key.headers))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("127.0.0.1/255.0.0.0", "has host bits set; did you mean 127.0.0.0/8?"),
        ("::ffff:127.0.0.1/104", "has host bits set; did you mean 127.0.0.0/8?"),
        ("127.0.0.0/255.0.255.0", "must be an IPv4 or IPv6 address or CIDR"),
        ("2001:db8::/ffff:ffff::", "must be an IPv4 or IPv6 address or CIDR"),
    ],
)
async def test_bad_mask_and_mapped_sources(
    client: Client, admin: Creds, source: str, message: str
) -> None:
    body = {"name": "r", "roles": ["developer"], "ipAccessList": [{"source": source}]}
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys", json=body, headers=admin.headers
    )
    await assert_error(response, 400, f"ipAccessList.0.source: {message}")
