"""keysvc.http.shares on its own: what a TCP peer is counted under, and the counts."""

import ipaddress

import pytest

from keysvc.config import ConfigError, build_settings
from keysvc.http.shares import Shares, network_of_peer, unix_reserve

TRUSTED = (ipaddress.ip_network("10.0.0.0/8"),)


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    one = network_of_peer(("2001:db8:1:2::1", 5000, 0, 0), ())
    same = network_of_peer(("2001:db8:1:2:ffff:ffff:ffff:ffff", 5001, 0, 0), ())
    other = network_of_peer(("2001:db8:1:3::1", 5000, 0, 0), ())
    assert one == same != other


def test_an_ipv4_mapped_client_is_its_ipv4_address() -> None:
    assert network_of_peer(("::ffff:192.0.2.7", 1, 0, 0), ()) == network_of_peer(
        ("192.0.2.7", 2), ()
    )
    assert network_of_peer(("192.0.2.7", 1), ()) != network_of_peer(("192.0.2.8", 1), ())


def test_a_trusted_proxy_is_counted_under_no_address() -> None:
    assert network_of_peer(("10.1.2.3", 1), TRUSTED) is None
    assert network_of_peer(("::ffff:10.1.2.3", 1, 0, 0), TRUSTED) is None
    assert network_of_peer(("11.1.2.3", 1), TRUSTED) is not None


def test_a_nat64_client_is_its_ipv4_address() -> None:
    """rt49 F4: every IPv4 client of a translator is its own client."""
    one = network_of_peer(("64:ff9b::c000:207", 1, 0, 0), ())
    assert one == network_of_peer(("192.0.2.7", 1), ())
    assert one != network_of_peer(("64:ff9b::c000:208", 1, 0, 0), ())


def test_a_nat64_peer_is_trusted_as_received() -> None:
    """rt50 G2: as keysvc.http.auth trusts it, by its own address, never its IPv4 client's."""
    peer = ("64:ff9b::a00:1", 1, 0, 0)
    assert network_of_peer(peer, (ipaddress.ip_network("64:ff9b::a00:1/128"),)) is None
    assert network_of_peer(peer, (ipaddress.ip_network("10.0.0.1/32"),)) is not None


def test_link_local_neighbours_on_other_interfaces_are_others() -> None:
    """rt49 F4: fe80::/64 is on every interface."""
    on_two = network_of_peer(("fe80::1", 1, 0, 2), ())
    assert on_two == network_of_peer(("fe80::2", 1, 0, 2), ())
    assert on_two != network_of_peer(("fe80::1", 1, 0, 3), ())


def test_a_share_is_never_more_than_half_of_tcps_slots() -> None:
    """rt49 F2: a share at or over the cap let one address take every slot."""
    shares = Shares(tcp_limit=50, per_address=100, trusted=())
    assert shares.per_address == 25
    a = ("192.0.2.1", 1)
    assert [shares.take(a)[0] for _ in range(26)] == [None] * 25 + ["address"]
    assert shares.take(("192.0.2.2", 1))[0] is None


def test_a_peer_without_an_address_shares_one_count() -> None:
    assert network_of_peer(None, ()) == network_of_peer(("not an address", 1), ()) == b""


def test_shares_refuse_past_each_limit_and_give_back() -> None:
    shares = Shares(tcp_limit=3, per_address=2, trusted=TRUSTED)
    a, b, proxy = ("192.0.2.1", 1), ("192.0.2.2", 1), ("10.0.0.1", 1)
    taken = [shares.take(a), shares.take(a)]
    assert all(refused is None for refused, _ in taken)
    refused, network = shares.take(a)
    assert refused == "address"
    assert shares.held(network) == 2
    assert shares.take(proxy) == (None, None)
    assert shares.take(b) == ("tcp", None)  # three open: TCP's whole share
    shares.give_back(taken[0][1])
    assert shares.held(network) == 1
    assert shares.take(b)[0] is None
    shares.give_back(None)  # the proxy's
    assert shares.tcp_open == 2
    assert shares.take(a)[0] is None
    assert shares.take(b) == ("tcp", None)


def test_below_half_of_tcps_slots_no_address_is_held_back() -> None:
    shares = Shares(tcp_limit=10, per_address=2, trusted=())
    a = ("192.0.2.1", 1)
    assert [shares.take(a)[0] for _ in range(6)] == [None] * 5 + ["address"]
    assert shares.take(("192.0.2.2", 1))[0] is None


def test_past_their_shares_addresses_draw_on_one_pool() -> None:
    """rt50 G1: only connections past a share count toward the pool's end."""
    shares = Shares(tcp_limit=20, per_address=3, trusted=())
    a, b, c = ("192.0.2.1", 1), ("192.0.2.2", 1), ("192.0.2.3", 1)
    assert [shares.take(c)[0] for _ in range(3)] == [None] * 3  # within its share
    assert [shares.take(a)[0] for _ in range(11)] == [None] * 10 + ["address"]
    assert shares.excess == 7
    assert [shares.take(b)[0] for _ in range(4)] == [None] * 3 + ["address"]
    network = shares.take(a)[1]
    shares.give_back(network)  # one of a's past its share
    assert shares.excess == 6
    assert shares.take(b)[0] is None
    assert shares.take(b)[0] == "address"


def test_the_unix_sockets_share() -> None:
    assert unix_reserve(1000, unix=True, tcp=True) == 100
    assert unix_reserve(9, unix=True, tcp=True) == 0  # a cap under ten keeps none
    assert unix_reserve(1000, unix=False, tcp=True) == 0
    assert unix_reserve(1000, unix=True, tcp=False) == 0


def test_the_per_address_setting() -> None:
    assert build_settings({}, {}).max_connections_per_address == 100
    env = {"KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "7"}
    assert build_settings({}, env).max_connections_per_address == 7
    with pytest.raises(ConfigError, match="at least 1"):
        build_settings({}, {"KEYSVC_MAX_CONNECTIONS_PER_ADDRESS": "0"})
