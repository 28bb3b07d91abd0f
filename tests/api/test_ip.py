"""IP access lists: the client address, trusted proxies, and forged headers."""

import ipaddress

import pytest

from keysvc.auth import address_allowed, client_address
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
TRUSTED = (NETS("127.0.0.0/8"), NETS("10.0.0.0/8"))


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "expected"),
    [
        ("127.0.0.1", None, (), "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7", (), "127.0.0.1"),  # untrusted peer: header ignored
        ("192.0.2.1", "198.51.100.7", TRUSTED, "192.0.2.1"),  # peer is no trusted proxy
        ("127.0.0.1", "198.51.100.7", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "1.1.1.1, 198.51.100.7, 10.0.0.9", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "10.0.0.8, 10.0.0.9", TRUSTED, "10.0.0.8"),  # all trusted: left-most
        ("127.0.0.1", "junk, 10.0.0.9", TRUSTED, "10.0.0.9"),  # trust stops at junk
        ("127.0.0.1", "2001:db8::5", TRUSTED, "2001:db8::5"),
        ("::ffff:127.0.0.1", "198.51.100.7", TRUSTED, "198.51.100.7"),  # v4-mapped peer
        (None, "198.51.100.7", TRUSTED, None),
        # Hops with a port, or in brackets (as some proxies write them).
        ("127.0.0.1", "198.51.100.7:52100", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "198.51.100.7:0", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "198.51.100.7:65535", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "[2001:db8::5]:443", TRUSTED, "2001:db8::5"),
        ("127.0.0.1", "[2001:db8::5]", TRUSTED, "2001:db8::5"),
        ("127.0.0.1", " [2001:DB8::5]:443 ", TRUSTED, "2001:db8::5"),
        ("127.0.0.1", "[::ffff:198.51.100.7]:80", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "1.1.1.1:1, 198.51.100.7:2, 10.0.0.9:3", TRUSTED, "198.51.100.7"),
        ("127.0.0.1", "[2001:db8::5]:443, [::ffff:10.0.0.9]:80", TRUSTED, "2001:db8::5"),
        # Unbracketed, an IPv6 address's last group is its own, not a port.
        ("127.0.0.1", "2001:db8::5:443", TRUSTED, "2001:db8::5:443"),
        # Anything else is junk, as before: trust stops at the last proxy known.
        ("127.0.0.1", "198.51.100.7:65536", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7:", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7:http", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7:80:80", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7:\u0668\u0660", TRUSTED, "127.0.0.1"),  # Arabic-Indic digits
        ("127.0.0.1", "198.51.100.7:123456", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "[198.51.100.7]:80", TRUSTED, "127.0.0.1"),  # brackets are for IPv6
        ("127.0.0.1", "[2001:db8::5]:", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "[2001:db8::5", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "2001:db8::5]:443", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "[2001:db8::5]443", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "[[2001:db8::5]]", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "[]:80", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "example.com:80", TRUSTED, "127.0.0.1"),
        ("127.0.0.1", "198.51.100.7:x, 10.0.0.9:80", TRUSTED, "10.0.0.9"),
    ],
)
def test_client_address(
    peer: str | None, forwarded: str | None, trusted: tuple[object, ...], expected: str | None
) -> None:
    found = client_address(peer, forwarded, trusted)  # type: ignore[arg-type]
    assert (None if found is None else str(found)) == expected


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("", None, None),  # the proxy said nothing of its client
        ("", "198.51.100.7", "198.51.100.7"),
        ("127.0.0.1", "198.51.100.7", "198.51.100.7"),  # whatever the peer's address
        ("", "1.1.1.1, 198.51.100.7", "198.51.100.7"),
        ("", "198.51.100.7, 10.0.0.9", "198.51.100.7"),  # trusted hops still skipped
        ("", "junk", None),
    ],
)
def test_client_address_from_the_unix_socket(
    peer: str, forwarded: str | None, expected: str | None
) -> None:
    """Through keysvc's unix socket the peer is the proxy, trusted whatever its range."""
    found = client_address(peer, forwarded, TRUSTED, from_proxy=True)  # type: ignore[arg-type]
    assert (None if found is None else str(found)) == expected


@pytest.mark.parametrize(
    ("address", "sources", "allowed"),
    [
        ("10.1.2.3", ["10.0.0.0/8"], True),
        ("11.1.2.3", ["10.0.0.0/8"], False),
        ("192.0.2.7", ["192.0.2.7"], True),
        ("2001:db8::1", ["2001:db8::/32"], True),
        ("2001:db9::1", ["2001:db8::/32"], False),
        ("10.1.2.3", ["2001:db8::/32"], False),  # no cross-family match
        ("2001:db8::1", ["10.0.0.0/8", "2001:db8::/32"], True),
        (None, ["0.0.0.0/0"], False),
        # Entries stored before they were normalized on the way in still match.
        ("127.0.0.1", ["::ffff:127.0.0.1"], True),
        ("10.1.2.3", ["::ffff:10.0.0.0/104"], True),
        ("11.1.2.3", ["::ffff:10.0.0.0/104"], False),
        ("10.1.2.3", ["10.0.0.0/255.0.0.0"], True),
    ],
)
def test_address_allowed(address: str | None, sources: list[str], allowed: bool) -> None:
    parsed = None if address is None else ipaddress.ip_address(address)
    assert address_allowed(parsed, [{"source": s} for s in sources]) is allowed


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
