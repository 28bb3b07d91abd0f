"""IP access list sources: the networks they name, in the one form keysvc keeps
and matches them in.

A client seen as an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is that IPv4
client (``keysvc.http.auth``), so a source written in the mapped form means the
IPv4 network and is kept as such; an IPv4 netmask or hostmask
(``127.0.0.0/255.0.0.0``, ``127.0.0.0/0.255.255.255``) is kept as the prefix
length it means (``127.0.0.0/8``). Any other source is kept as written.
"""

import ipaddress
from collections.abc import Sequence

from keysvc.config import IPNetwork

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_MAPPED_PREFIX = 96  # ::ffff:0:0/96 holds the IPv4-mapped addresses


def network_of(source: str) -> IPNetwork:
    """The network ``source`` names, an IPv4-mapped one as IPv4; ValueError if it
    names none, or has host bits set."""
    network = ipaddress.ip_network(source, strict=True)
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= _MAPPED_PREFIX:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.IPv4Network((mapped, network.prefixlen - _MAPPED_PREFIX))
    return network


def kept_source(source: str) -> str:
    """``source`` as it is stored: see the module docstring. ``source`` names a network."""
    network = network_of(source)
    address, slash, length = source.partition("/")
    mapped = network.version == 4 and ":" in address
    if not mapped and "." not in length:
        return source
    return network.with_prefixlen if slash else str(network.network_address)


def parse_address(text: str | None) -> IPAddress | None:
    """The address ``text`` holds (blanks around it ignored), an IPv4-mapped one as
    IPv4: an IPv4 client seen through a dual-stack socket is still that IPv4 client.
    None if it holds none."""
    try:
        address = ipaddress.ip_address((text or "").strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def within(address: IPAddress, networks: Sequence[IPNetwork]) -> bool:
    """Whether ``address`` is in one of ``networks``."""
    return any(address.version == net.version and address in net for net in networks)
