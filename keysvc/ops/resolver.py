"""The resolver webhook delivery connects through (``keysvc.ops.delivery``): aiohttp's
own, less the addresses a webhook may not be sent to (``keysvc.domain.targets.is_public``).
A name resolved at delivery may answer differently than at create (DNS rebinding); the
connector connects only to what this returned, so to an address that was checked.
"""

import socket
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from keysvc.domain.targets import ip_literal, is_public


class BlockedAddress(OSError):
    """The host resolved only to addresses a webhook may not be sent to."""


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
