"""IP access list sources with no server (keysvc.domain.addresses): the network a source
names, an IPv4-mapped one as IPv4, and the one form a source is kept in."""

import ipaddress

import pytest

from keysvc.domain.addresses import kept_source, network_of


@pytest.mark.parametrize(
    ("source", "network"),
    [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("192.0.2.7", "192.0.2.7/32"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),  # IPv4-mapped: the IPv4 network
        ("::ffff:192.0.2.7", "192.0.2.7/32"),
        ("::ffff:0:0/96", "0.0.0.0/0"),
        ("::/0", "::/0"),  # wider than the mapped block: stays IPv6
        ("127.0.0.0/255.0.0.0", "127.0.0.0/8"),
    ],
)
def test_the_network_a_source_names(source: str, network: str) -> None:
    assert network_of(source) == ipaddress.ip_network(network)


@pytest.mark.parametrize(
    "source", ["10.0.0.1/8", "not an address", "300.0.0.0/8", "::ffff:10.0.0.1/104", ""]
)
def test_a_source_naming_no_network_is_a_value_error(source: str) -> None:
    with pytest.raises(ValueError):
        network_of(source)


@pytest.mark.parametrize(
    ("source", "kept"),
    [
        ("10.0.0.0/8", "10.0.0.0/8"),  # as written
        ("192.0.2.7", "192.0.2.7"),
        ("2001:DB8::/32", "2001:DB8::/32"),
        ("127.0.0.0/255.0.0.0", "127.0.0.0/8"),  # a netmask: its prefix length
        ("127.0.0.0/0.255.255.255", "127.0.0.0/8"),  # a hostmask too
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),  # IPv4-mapped: as IPv4
        ("::ffff:192.0.2.7", "192.0.2.7"),
    ],
)
def test_a_source_is_kept_in_one_form(source: str, kept: str) -> None:
    assert kept_source(source) == kept
    assert network_of(kept) == network_of(source)
