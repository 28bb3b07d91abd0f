"""Who may hold ``keysvc serve``'s connection slots (rt46 C1, rt47 E1).

The cap (``KEYSVC_MAX_CONNECTIONS``) bounds how many connections are open; it does
not say who holds them, and a client that keeps its connections just alive (a few
bytes a header-timeout, or a few hundred a second read) could hold every one. So:

- one client address holds ``KEYSVC_MAX_CONNECTIONS_PER_ADDRESS`` TCP connections
  (an IPv6 client, per /64, the least a host is given) whatever the others do, and
  more only from a pool of half of TCP's slots less one share, which every address
  past its share draws on: so one address holds at most half of TCP's slots, and a
  host that needs more than its share (several client pools: aiohttp's holds 100)
  gets it while the pool lasts, however many clients stay within their shares
  (rt49 F1, rt50 G1); one address past its share can draw the pool dry (rt51 H1).
  A trusted proxy's address (``KEYSVC_TRUSTED_PROXIES``), which carries many
  clients' requests, is held to the cap alone;
- when keysvc serves a unix socket besides TCP, a tenth of the cap is kept for it:
  TCP connections together hold at most the rest, so that the proxy beside keysvc
  (and ``/healthz`` through it) is never refused because TCP clients took every slot.

A connection that would go past either is closed as soon as it is accepted, as one
past the cap is. Nothing is ever taken from a connection already open: choosing one
to close for a newcomer let a flood throw out the clients it was meant to protect
(rt47 E2 to E4). Six addresses at the defaults (one at half, five at their share)
can still hold every TCP slot; a per-address limit in front (a firewall's) is what
bounds many addresses together.
"""

import ipaddress
from collections.abc import Sequence
from typing import Any

from keysvc.config import IPNetwork
from keysvc.domain.addresses import parse_address, within

# The share of the cap kept for the unix socket when TCP is served too.
UNIX_SHARE = 10
# What the addresses that cannot be read (none should reach here) are counted under: one.
_UNKNOWN = b""


def unix_reserve(max_connections: int, unix: bool, tcp: bool) -> int:
    """The slots TCP connections may not take: a tenth of the cap (rounded down, so a
    cap under ten keeps none) when both a unix socket and TCP are served."""
    return max_connections // UNIX_SHARE if unix and tcp else 0


# NAT64's well-known prefix (RFC 6052): each IPv4 client of a translator, as itself.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def network_of_peer(peer: Any, trusted: Sequence[IPNetwork]) -> bytes | None:
    """What a TCP peer (``peername``) is counted under: its IPv4 address (an
    IPv4-mapped or NAT64 address's too), or its IPv6 address's /64, with the scope
    for a link-local one (each interface's neighbours are others); None for a
    trusted proxy, counted under no address."""
    host = peer[0] if isinstance(peer, tuple) and peer else None
    address = parse_address(host) if isinstance(host, str) else None
    if address is None:
        return _UNKNOWN
    # Trusted as keysvc.http.auth trusts a peer: the address as received (rt50 G2).
    if within(address, trusted):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address in _NAT64:
        address = ipaddress.IPv4Address(address.packed[12:])
    if isinstance(address, ipaddress.IPv4Address):
        return b"4" + address.packed
    network = b"6" + address.packed[:8]
    if address.is_link_local and isinstance(peer, tuple) and len(peer) > 3:
        network += str(peer[3]).encode()
    return network


class Shares:
    """The TCP connections open, in all and by network, against their limits."""

    def __init__(self, tcp_limit: int, per_address: int, trusted: Sequence[IPNetwork]):
        self.tcp_limit = tcp_limit
        half = (tcp_limit + 1) // 2
        # A share is never more than half of TCP's slots: else one address could take
        # every slot (rt49 F2).
        self.per_address = max(1, min(per_address, half))
        # The connections held past their address's share, all addresses together, and
        # how many there may be: one address holds at most half of TCP's slots. Only a
        # connection past a share counts, so that clients within theirs, however many,
        # never hold back a host that needs more (rt50 G1: counting every connection,
        # an attacker within its shares made every larger host its share's prisoner).
        self.excess_limit = half - self.per_address
        self.excess = 0
        self._trusted = tuple(trusted)
        self.tcp_open = 0
        self._by_network: dict[bytes, int] = {}

    def take(self, peer: Any) -> tuple[str | None, bytes | None]:
        """Count one more TCP connection from ``peer``: (None, the network it counts
        under, to give back) if it may be opened; else (which limit refuses it: "tcp",
        or "address" with the network that holds its share), counting nothing."""
        if self.tcp_open >= self.tcp_limit:
            return "tcp", None
        network = network_of_peer(peer, self._trusted)
        if network is not None:
            held = self._by_network.get(network, 0)
            if held >= self.per_address:
                if self.excess >= self.excess_limit:
                    return "address", network
                self.excess += 1
            self._by_network[network] = held + 1
        self.tcp_open += 1
        return None, network

    def give_back(self, network: bytes | None) -> None:
        """A connection that ``take`` counted under ``network`` is closed."""
        self.tcp_open -= 1
        if network is None:
            return
        held = self._by_network[network] - 1
        if held >= self.per_address:
            self.excess -= 1
        if held:
            self._by_network[network] = held
        else:
            del self._by_network[network]

    def held(self, network: bytes | None) -> int:
        """How many TCP connections ``network`` holds (for a refusal's line)."""
        return 0 if network is None else self._by_network.get(network, 0)
