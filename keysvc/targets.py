"""Where webhooks may be sent: the URL rules checked at create, and the resolver that
checks every address again at delivery (server-side request forgery).

A webhook URL is http or https, carries no credentials, and (unless
KEYSVC_WEBHOOK_ALLOW_PRIVATE is on) names a host that is, and resolves only to,
public addresses: not loopback, private, link-local, multicast, reserved or
unspecified, IPv4 or IPv6, an IPv4-mapped IPv6 address judged as its IPv4 one. A
name resolved again at delivery may answer differently (DNS rebinding): the
delivery's connector resolves through ``GuardedResolver``, which drops such
addresses, so the connection goes to an address that was checked.
"""

import asyncio
import ipaddress
import socket
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from keysvc.addresses import IPAddress
from keysvc.errors import BadRequest
from keysvc.schemas import MAX_WEBHOOK_URL

# How long a create waits for the URL's host to resolve.
RESOLVE_SECONDS = 5.0
PRIVATE_TARGET = (
    "url: {host} is, or resolves to, a loopback, private or otherwise non-public address;"
    " give a public host (an operator may allow private targets with"
    " KEYSVC_WEBHOOK_ALLOW_PRIVATE=1)"
)


class BlockedAddress(OSError):
    """The host resolved only to addresses a webhook may not be sent to."""


def is_public(address: IPAddress) -> bool:
    """Whether a webhook may be sent to ``address``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` is written as, if it is one (yarl gives IPv6 unbracketed)."""
    try:
        return ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None


def parse_url(text: str) -> URL:
    """``text`` as a webhook URL, or the 400 that says what to change. Addresses are
    not checked here (``check_addresses``)."""
    if len(text) > MAX_WEBHOOK_URL:
        raise BadRequest(f"url: must be at most {MAX_WEBHOOK_URL} characters")
    try:
        url = URL(text)
    except ValueError:
        raise BadRequest("url: is not a URL; give one such as https://example.com/hooks") from None
    if url.scheme not in ("http", "https"):
        raise BadRequest("url: must start with https:// or http://")
    if not url.host:
        raise BadRequest("url: has no host; give one such as https://example.com/hooks")
    if url.user is not None or url.password is not None:
        raise BadRequest("url: must not carry a user name or password")
    if url.fragment:
        raise BadRequest("url: must not have a #fragment")
    return url


async def check_addresses(url: URL, allow_private: bool) -> None:
    """Refuse ``url`` (400) when its host is, or resolves to, a non-public address, or
    does not resolve; with ``allow_private``, anything goes."""
    if allow_private:
        return
    host = url.raw_host or ""
    literal = ip_literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            async with asyncio.timeout(RESOLVE_SECONDS):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, url.port, type=socket.SOCK_STREAM
                )
        except (OSError, UnicodeError, TimeoutError):
            raise BadRequest(f"url: the host {host[:255]} does not resolve") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos]
    if not addresses or not all(is_public(address) for address in addresses):
        raise BadRequest(PRIVATE_TARGET.format(host=host[:255]))


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, less the addresses a webhook may not be sent to; none left
    is a ``BlockedAddress``. The connector then connects to what this returned."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        if self._allow_private:
            return found
        kept = [entry for entry in found if _public_entry(entry)]
        if not kept:
            raise BlockedAddress(f"{host} resolves to no public address")
        return kept

    async def close(self) -> None:
        await self._inner.close()


def _public_entry(entry: ResolveResult | dict[str, Any]) -> bool:
    literal = ip_literal(str(entry["host"]))
    return literal is not None and is_public(literal)
