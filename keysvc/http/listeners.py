"""Where ``keysvc serve`` listens: host:port over TCP, a unix socket, or both.

The unix socket (``--unix``) is for the proxy in front of keysvc. Its file is
mode 0660 with the group ``--unix-group`` names, so only the proxy's user (and
keysvc's) can connect: that is why keysvc believes the ``X-Forwarded-For`` it
receives there (keysvc.http.auth), where over TCP it believes only
``--trusted-proxies``. The socket is bound once, before any worker is forked,
and every worker serves that same listening socket (TCP workers each bind the
port with SO_REUSEPORT instead). A socket file left behind by a process that
was killed is replaced; one a live server still answers on is not, nor any
other kind of file.

At start, one warning says when a trusted proxy range holds a loopback address
while keysvc serves TCP on loopback: every local process then connects from a
trusted address and can forge the client's.
"""

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from keysvc.config import ConfigError, IPNetwork, Settings
from keysvc.db.backends import describe

SOCKET_MODE = 0o660
# Pending connections the kernel keeps before a worker accepts them; aiohttp's own.
BACKLOG = 128
_LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")
_LOOPBACK_V6 = ipaddress.ip_address("::1")

logger = logging.getLogger("keysvc")


@contextlib.contextmanager
def prepared(settings: Settings) -> Iterator[socket.socket | None]:
    """Before serving (and before forking workers): refuse a configuration that listens
    nowhere, warn about a trusted loopback, and yield the bound unix socket if one is
    asked for. On leaving, the socket file is removed if it is still this one."""
    if not settings.tcp and settings.unix_path is None:
        raise ConfigError("tcp: off needs --unix PATH, or keysvc would listen nowhere")
    warn_if_loopback_is_trusted(settings)
    if settings.unix_path is None:
        yield None
        return
    path = settings.unix_path
    sock = _bind_unix(path, settings.unix_group)
    made = os.stat(path).st_ino
    try:
        yield sock
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == made:
                path.unlink()


async def start(
    runner: web.AppRunner, settings: Settings, reuse_port: bool, unix: socket.socket | None
) -> list[web.BaseSite]:
    """Start serving ``runner`` on host:port (unless tcp is off) and on ``unix``."""
    sites: list[web.BaseSite] = []
    if settings.tcp:
        sites.append(
            web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port or None)
        )
    if unix is not None:
        sites.append(web.SockSite(runner, unix, backlog=BACKLOG))
    # The loop's own module (asyncio or uvloop), so the line says what really runs.
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    for site in sites:
        await site.start()
        logger.info(
            "Running on %s with database %s, event loop %s (Press CTRL+C to quit)",
            site.name,
            describe(settings),
            loop,
        )
    return sites


def _bind_unix(path: Path, group: int | None) -> socket.socket:
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # Owner-only from the moment it exists, until it has its group.
        umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(umask)
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, SOCKET_MODE)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"unix: cannot listen on {path}: {exc.strerror or exc}") from None
    return sock


def _remove_stale(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"unix: {path} exists and is not a socket; keysvc leaves it alone")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()  # nothing listens: left by a process that did not stop cleanly
            return
        except OSError as exc:
            raise ConfigError(f"unix: cannot check {path}: {exc.strerror or exc}") from None
    raise ConfigError(f"unix: a server is already listening on {path}")


def _holds_loopback(network: IPNetwork) -> bool:
    if isinstance(network, ipaddress.IPv4Network):
        return network.overlaps(_LOOPBACK_V4)
    return _LOOPBACK_V6 in network


def _serves_loopback(host: str, port: int) -> bool:
    """Whether binding ``host`` listens on a loopback address (a wildcard does too)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False  # the bind itself will say what is wrong with the host
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address.is_loopback or address.is_unspecified:
            return True
    return False


def warn_if_loopback_is_trusted(settings: Settings) -> None:
    trusted = [str(net) for net in settings.trusted_proxies if _holds_loopback(net)]
    if not settings.tcp or not trusted or not _serves_loopback(settings.host, settings.port):
        return
    logger.warning(
        "trusted proxies %s include loopback, and keysvc serves TCP on %s:%d: any process"
        " on this machine can connect from loopback and forge X-Forwarded-For, the client"
        " address that IP access lists and the failed-login limit check. Put the proxy on"
        " the unix socket (--unix) and take loopback out of --trusted-proxies",
        ", ".join(trusted),
        settings.host,
        settings.port,
    )
