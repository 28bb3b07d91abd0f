"""IP access lists without the app: the client address (peer, trusted proxies,
forwarded-for, the unix socket) and whether an address is allowed."""

import ipaddress

import pytest

from keysvc.http.auth import address_allowed, client_address

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
