"""Where webhooks may be sent (server-side request forgery): the URL rules checked at
create, and ``is_public``, which the delivery's resolver (``keysvc.ops.resolver``)
asks again of every address it connects to (against DNS rebinding).

A webhook URL is http or https, carries no credentials and, unless
KEYSVC_WEBHOOK_ALLOW_PRIVATE is on, names a host that is, and resolves only to, public
addresses: not in any special-purpose range that is not globally reachable (listed
here, not Python's ``is_global``), IPv6 only in 2000::/3, mapped and 6to4 addresses
judged by the IPv4 address they carry, Teredo refused. A host name is checked label
by label (letters, digits, ``-``, ``_``; IDNA where it says so). The threat and the
rules in full: docs/SECURITY.md, "Webhooks: request forgery from inside, and the
signing secret".
"""

import asyncio
import ipaddress
import re
import socket

from yarl import URL

from keysvc.domain.addresses import IPAddress
from keysvc.domain.limits import MAX_WEBHOOK_URL
from keysvc.errors import BadRequest

# How long a create waits for the URL's host to resolve.
RESOLVE_SECONDS = 5.0
NOT_A_URL = "url: is not a URL; give one such as https://example.com/hooks"
# A DNS name as a host: at most 253 characters, in labels of 1 to 63 (RFC 1035); ``_``
# is allowed, as some service names hold it.
MAX_NAME, LABEL = 253, re.compile(r"[a-z0-9_-]{1,63}")
# IANA's special-purpose ranges that reach no public host (RFC 6890 and its updates),
# whatever a Python version's ``is_global`` says of them. 6to4 (2002::/16) is judged
# by the IPv4 address it wraps; Teredo (2001::/32) falls within 2001::/23.
NOT_PUBLIC = tuple(
    ipaddress.ip_network(network)
    for network in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
        "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
        "2001:db8::/32", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10",
        "ff00::/8",
    )
)  # fmt: skip
# The only IPv6 space allocated for global unicast (IPv4-mapped addresses are judged
# as their IPv4 ones before this).
GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
PRIVATE_TARGET = (
    "url: {host} is, or resolves to, a loopback, private or otherwise non-public address;"
    " give a public host (an operator may allow private targets with"
    " KEYSVC_WEBHOOK_ALLOW_PRIVATE=1)"
)


def is_public(address: IPAddress) -> bool:
    """Whether a webhook may be sent to ``address``. An IPv4-mapped address is its IPv4
    one; a 6to4 or Teredo address is public only if the IPv4 addresses it carries are
    too, as a relay would deliver to them."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public(address.ipv4_mapped)
        wrapped = [address.sixtofour, *(address.teredo or ())]
        if not all(is_public(inner) for inner in wrapped if inner is not None):
            return False
        if address not in GLOBAL_UNICAST:
            return False
    return (
        address.is_global
        and not (
            address.is_loopback
            or address.is_private
            or address.is_link_local
            or address.is_multicast
            or address.is_reserved
            or address.is_unspecified
        )
        and not any(address in network for network in NOT_PUBLIC)
    )


def ip_literal(host: str) -> IPAddress | None:
    """The address ``host`` is written as, if it is one. yarl gives an IPv6 literal
    unbracketed, the only host with a ``:``; only there does ``%`` start a zone ID, left
    out. Anywhere else ``%`` makes the host no address."""
    if ":" in host:
        host = host.partition("%")[0]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _valid_host(url: URL) -> bool:
    """Whether ``url``'s host is an IPv6 literal, or a name (an IPv4 literal is one)
    whose labels are well formed and whose IDNA labels decode."""
    host = url.raw_host or ""
    if ":" in host:
        return ip_literal(host) is not None
    name = host.removesuffix(".")
    if len(name) > MAX_NAME or not all(LABEL.fullmatch(label) for label in name.split(".")):
        return False
    try:
        return bool(url.host)  # decodes the IDNA labels
    except UnicodeError:
        return False


def parse_url(text: str) -> URL:
    """``text`` as a webhook URL, or the 400 that says what to change. Addresses are
    not checked here (``check_addresses``)."""
    if len(text) > MAX_WEBHOOK_URL:
        raise BadRequest(f"url: must be at most {MAX_WEBHOOK_URL} characters")
    try:
        url = URL(text)
    except ValueError:
        raise BadRequest(NOT_A_URL) from None
    if url.scheme not in ("http", "https"):
        raise BadRequest("url: must start with https:// or http://")
    if not url.raw_host:
        raise BadRequest("url: has no host; give one such as https://example.com/hooks")
    if not _valid_host(url):
        raise BadRequest(NOT_A_URL)
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
