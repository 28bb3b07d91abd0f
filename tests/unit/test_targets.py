"""The delivery-time resolver (``GuardedResolver``) on literal addresses: it applies
the create's rules, so a 6to4 or Teredo wrapping of a non-public IPv4 address, or an
address in a range ``is_global`` lets through, is dropped, and a public one kept."""

import socket

import pytest

from keysvc.ops.resolver import BlockedAddress, GuardedResolver

BLOCKED = [
    ("2002:7f00:1::", socket.AF_INET6),
    ("2002:a9fe:a9fe::", socket.AF_INET6),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", socket.AF_INET6),
    ("192.0.0.8", socket.AF_INET),
    ("192.88.99.1", socket.AF_INET),
]


async def resolved(host: str, family: socket.AddressFamily, allow_private: bool) -> list[str]:
    """The addresses the resolver keeps for ``host``."""
    resolver = GuardedResolver(allow_private)
    try:
        return [str(entry["host"]) for entry in await resolver.resolve(host, 80, family)]
    finally:
        await resolver.close()


@pytest.mark.parametrize(("host", "family"), BLOCKED)
async def test_the_resolver_drops_them(host: str, family: socket.AddressFamily) -> None:
    with pytest.raises(BlockedAddress):
        await resolved(host, family, allow_private=False)
    # An operator who allows private targets gets them.
    assert await resolved(host, family, allow_private=True) == [host]


@pytest.mark.parametrize(
    ("host", "family"), [("2002:5db8:d70e::", socket.AF_INET6), ("93.184.215.14", socket.AF_INET)]
)
async def test_the_resolver_keeps_public_ones(host: str, family: socket.AddressFamily) -> None:
    assert await resolved(host, family, allow_private=False) == [host]
