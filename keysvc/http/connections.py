"""The connections of ``keysvc serve``: how long a client may take to send a request's
head, how slowly it may read its answers, how long a kept-alive connection may wait
for its next request, and how many connections may be open at once.

aiohttp closes idle connections itself (``keepalive_timeout``, from
``idle_timeout``) but has no deadline for a request's head and no connection limit;
both need the connection's own events, which only its ``RequestHandler`` gets, and
``web.Server`` builds that class by name: hence ``GuardedHandler`` and the server and
runner that build it. A connection over ``max_connections`` is closed when accepted,
the open-file limit fitted to the cap (``fit_open_files``); refusals are logged a few
lines at a time (``keysvc.logs.Throttled``).
"""

import asyncio
import contextlib
import logging
import resource
import socket
import struct
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

from keysvc.config import Settings
from keysvc.http.coalesce import Coalesced, Writes
from keysvc.http.dispatch import DispatchRunner
from keysvc.http.shares import Shares, unix_reserve
from keysvc.logs import Throttled

logger = logging.getLogger("keysvc")
# How often each kind of connection log line may be written (one line, then a
# summary of what was left out at the end of the interval).
LOG_INTERVAL_SECONDS = 10.0
# Descriptors the process needs besides the connections under the cap. A
# connection over the cap holds its descriptor for a few turns of the event
# loop before it is closed, and in each turn asyncio accepts up to a listen
# backlog's worth (aiohttp's default: 128): four backlogs cover those. Then the
# database and its WAL, the log, the listening sockets and the loop's own.
SPARE_DESCRIPTORS = 4 * 128 + 64


def _once_per_interval(level: int, summary: str) -> Throttled:
    return Throttled(logger, level, burst=1, interval=LOG_INTERVAL_SECONDS, summary=summary)


# Why Guard closed a connection: the level of the line that says so, and which they were.
_CLOSED = {
    "timed_out": (logging.INFO, "that sent no whole request head"),
    "unread": (logging.INFO, "whose clients read none of their answers"),
    "failed": (logging.ERROR, "whose handling failed"),
    "bad_body": (logging.INFO, "whose request bodies could not be read"),
}


class Guard:
    """What the connections of one server share: the limits, the count of open
    connections, and the throttled lines on those refused or cut off."""

    def __init__(self, header_timeout: float, max_connections: int, shares: Shares):
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        # Who may hold the slots TCP connections take (keysvc.http.shares).
        self.shares = shares
        # How long a client with answers waiting may acknowledge none of them.
        self.stall_seconds = max(STALLED_INTERVALS * header_timeout, STALLED_SECONDS)
        self.open = 0
        # The answers of each turn of the loop, sent together (keysvc.http.coalesce).
        self.writes = Writes()
        self._refused = _once_per_interval(
            logging.WARNING,
            "refused %d more connections at the connection cap in the last %g s",
        )
        # One throttle a kind, so that one address refused without end does not hide
        # that TCP as a whole is full, nor the other way round (rt49 F5).
        self._crowded = {
            "address": _once_per_interval(
                logging.WARNING,
                "refused %d more TCP connections from addresses past their share in the last %g s",
            ),
            "tcp": _once_per_interval(
                logging.WARNING,
                "refused %d more TCP connections past TCP's share in the last %g s",
            ),
        }
        # The connections closed, a throttle a reason: its level, and which they were.
        self._closed = {
            reason: _once_per_interval(
                level, f"closed %d more connections {which} in the last %g s"
            )
            for reason, (level, which) in _CLOSED.items()
        }

    def refused(self) -> None:
        self._refused.log(
            "refusing new connections: %d are open, the most allowed (max-connections)",
            self.open,
            extra={"openConnections": self.open},
        )

    def crowded(self, limit: str, peer: Any, network: bytes | None) -> None:
        if limit == "address":
            self._crowded[limit].log(
                "refusing new TCP connections from an address that holds %d"
                " (max-connections-per-address); %d of the %d past shares are held",
                self.shares.held(network),
                self.shares.excess,
                self.shares.excess_limit,
                extra={"remote": peer[0] if isinstance(peer, tuple) and peer else None},
            )
        else:
            self._crowded[limit].log(
                "refusing new TCP connections: %d are open, the most the unix socket's"
                " share of max-connections leaves",
                self.shares.tcp_open,
                extra={"openConnections": self.open},
            )

    def timed_out(self) -> None:
        self._closed["timed_out"].log(
            "closed a connection that sent no whole request head in %g s (header-timeout)",
            self.header_timeout,
        )

    def failed(self, error: BaseException) -> None:
        """aiohttp's handling of a connection ended on an error of its own: named, but no
        traceback, as a client may cause it at will."""
        self._closed["failed"].log(
            "closed a connection whose handling failed: %s", type(error).__name__
        )

    def bad_body(self, error: Exception) -> None:
        """A body the view left unread could not be read as it was drained (a
        Content-Encoding it is not in): the client's doing, as often as it likes, so no
        traceback (rt52 F3: aiohttp logged one at error level for each)."""
        self._closed["bad_body"].log(
            "closed a connection whose request body could not be read: %s",
            type(error).__name__,
        )

    def unread(self) -> None:
        self._closed["unread"].log(
            "closed a connection whose client read none of its answers in %g s",
            self.stall_seconds,
        )


# After answering a request whose head it refused, how long keysvc keeps reading (and
# dropping) what the client still sends before it closes. A socket closed with bytes
# unread resets the connection: a proxy still writing the rest of that head (Caddy's
# forward_auth passes keysvc every client header) got a write error in place of the
# answer, and made keysvc's 400 its own 502, or Caddyfile's 503 (rt41 R1).
LINGER_SECONDS = 2.0
# And how much of it: more than any head a proxy would still be writing (keysvc reads
# 16 KiB a line), then the connection is closed, unread bytes or not (rt42 F2).
LINGER_BYTES = 256 * 1024


# A TCP client with answers waiting for it that acknowledges none of them for this many
# header-timeouts, and at least STALLED_SECONDS, is aborted (rt42 F1, rt43 G1). A time,
# not a count of checks: a receiver's kernel reopens a closed window only once a good
# part of its buffer is free, so a slow reader acknowledges nothing in between, for
# many seconds on loopback, whose segments are tens of KB (rt44 H1, rt45 R2-1). The
# floor keeps a reader of one window update in STALLED_SECONDS whatever the header
# timeout; it is under the default idle timeout, so that a client reading nothing holds
# its connection no longer than an idle one may (docs/SECURITY.md has the figures).
STALLED_INTERVALS = 2
STALLED_SECONDS = 30.0
# The kernel's send buffer of each accepted TCP connection, fixed: left to Linux's
# autotuning it grows to 4 MB, which a slow reader kept full, a 1,000-connection cap
# of them some 2 GB of the host's TCP memory (rt44 H2). The kernel doubles it.
SEND_BUFFER_BYTES = 128 * 1024
# Linux's struct tcp_info (linux/tcp.h): how many of its bytes to ask for, and where
# tcpi_unacked (segments sent, not acknowledged), tcpi_bytes_acked and
# tcpi_notsent_bytes lie in it.
_TCP_INFO_LENGTH = 152
_UNACKED = struct.Struct("=I")
_UNACKED_AT = 24
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120
_NOTSENT = struct.Struct("=I")
_NOTSENT_AT = 144


def acknowledged(sock: Any) -> tuple[int, bool] | None:
    """How many bytes of what keysvc sent on the TCP socket ``sock`` its peer has
    acknowledged (taken into its receive window), and whether more wait for it in the
    kernel; None where the kernel does not say (not Linux, not TCP)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
    except (AttributeError, OSError):
        return None
    if len(info) < _NOTSENT_AT + _NOTSENT.size:
        return None
    (acked,) = _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)
    (unacked,) = _UNACKED.unpack_from(info, _UNACKED_AT)
    (notsent,) = _NOTSENT.unpack_from(info, _NOTSENT_AT)
    return acked, bool(unacked or notsent)


class _HalfClosing:
    """A connection's transport whose ``close`` half-closes it once the answer is
    written (``write_eof``), then closes it whole after LINGER_SECONDS; the client's own
    close ends it sooner (asyncio closes a transport at its end of input)."""

    __slots__ = ("_loop", "_transport", "dropped")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        # Bytes read and dropped since the answer.
        self.dropped = 0

    def drop(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > LINGER_BYTES:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        transport = self._transport
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            # Reset by the client meanwhile (asyncio's loop raises here, uvloop's does
            # not): nothing is left to linger over (rt49 F6).
            transport.close()
            return
        self._loop.call_later(LINGER_SECONDS, transport.close)


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler, with the connection cap, a deadline for
    each request's head (from the moment the connection is made, and from the
    first byte of each later request), and a bound on a client that reads none
    of its answers.

    That bound is judged by what the client's TCP stack acknowledged, checked once
    every header-timeout: with answers waiting for it (keysvc's buffer, or the
    kernel's), a client that acknowledged not one byte of them for the guard's
    ``stall_seconds`` (from the first check that saw them wait) is aborted; and the
    kernel's send buffer is fixed at SEND_BUFFER_BYTES, so that a slow reader holds
    little memory. Without these a client that pipelined requests and never read
    held its connection, one of the capped number, for as long as it liked (rt42
    F1): the answers filled a send queue the kernel grows to megabytes, and keysvc
    kept answering. Whether keysvc's writes are paused does not tell it: a client
    reading tens of KB a second never let them resume (rt43 G2)."""

    __slots__ = (
        "_acked",
        "_body",
        "_close_deadline",
        "_coalesced",
        "_counted",
        "_guard",
        "_head_deadline",
        "_network",
        "_read_watch",
        "_since",
        "_tcp",
    )

    def __init__(self, manager: web.Server, *, guard: Guard, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._head_deadline: asyncio.TimerHandle | None = None
        self._read_watch: asyncio.TimerHandle | None = None
        # What the client had acknowledged at the last check, if answers were waiting,
        # and the time of the first check that saw that much with answers waiting.
        self._acked: int | None = None
        self._since = 0.0
        self._tcp: Any = None
        # The connection's transport as aiohttp writes to it (keysvc.http.coalesce).
        self._coalesced: Coalesced | None = None
        self._close_deadline: asyncio.TimerHandle | None = None
        self._counted = False
        # A TCP connection's: the network Shares.take counted it under.
        self._network: bytes | None = None
        # The body of the last request whose head arrived: bytes that come while it is
        # still being received are its, not the start of another head.
        self._body: StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.max_connections:
            # Never handed to aiohttp: closed before anything is read or started.
            guard.refused()
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            peer = transport.get_extra_info("peername")
            refused, network = guard.shares.take(peer)
            if refused is not None:
                guard.crowded(refused, peer, network)
                transport.close()
                return
            # A unix socket's client is the proxy beside keysvc, which reads every
            # answer whatever its own client does: only TCP's are watched, and shared.
            self._tcp, self._network = sock, network
        guard.open += 1
        self._counted = True
        self._coalesced = Coalesced(transport, guard.writes, self._loop)
        # Not an asyncio.Transport's subclass, whose methods would hide the transport's.
        super().connection_made(cast(asyncio.Transport, self._coalesced))
        self._start_head_deadline()
        if self._tcp is not None:
            with contextlib.suppress(OSError):  # else left as the kernel chose
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            self._read_watch = self._loop.call_later(guard.header_timeout, self._check_reads)

    def eof_received(self) -> None:
        # The client's end of input: on return the transport closes itself, past
        # Coalesced.close, so what this connection holds goes to it first: an answer
        # written before the client's FIN is sent, as it was before answers were held
        # (rt55 F2).
        if self._coalesced is not None:
            self._coalesced.send()
        super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._close and isinstance(self.transport, _HalfClosing):
            self.transport.drop(data)
        heads = self._request_count
        # Asked before the bytes are parsed: those that end a body are still its.
        in_body = self._body is not None and not self._body.is_eof()
        super().data_received(data)
        if not data:
            return
        if self._request_count != heads:
            self._body = self._messages[-1][1] if self._messages else None
            self._stop_head_deadline()
            if self._next_head_begun(data):
                self._start_head_deadline()
        elif self._head_deadline is None and not in_body:
            # No request's body is coming: these bytes begin the next head, whether the
            # handler waits for it, answers a request or has just sent an answer.
            self._start_head_deadline()

    def _next_head_begun(self, data: bytes) -> bool:
        """Whether ``data``, which completed one or more heads, also holds the start of
        another: known where the last request it completed has no body, so that every
        byte after its head belongs to the next one. (After a body, whether bytes
        remain cannot be told from here: such a head is the idle timeout's to end.)"""
        if not self._messages:
            return False
        payload = self._messages[-1][1]
        return payload is EMPTY_PAYLOAD and not data.endswith((b"\r\n\r\n", b"\n\n"))

    def linger(self) -> None:
        """Once this answer (to a head the parser refused) is written, read and drop
        whatever else the client sends until it closes, LINGER_SECONDS at most, rather
        than reset a connection it is still writing to (``_HalfClosing``)."""
        transport = self.transport
        # asyncio's or uvloop's (whose classes are not asyncio.Transport's).
        if transport is not None and not isinstance(transport, _HalfClosing):
            # Nothing more is parsed: what comes is dropped (aiohttp's own check).
            self._close = True
            self.transport = _HalfClosing(transport, self._loop)  # type: ignore[assignment]

    def _check_reads(self) -> None:
        self._read_watch = None
        transport = self.transport
        state = acknowledged(self._tcp)
        if transport is None or state is None:
            return
        acked, waiting = state
        waiting = waiting or bool(transport.get_write_buffer_size())
        now = self._loop.time()
        if not (waiting and self._acked == acked):
            self._since = now
        elif now - self._since >= self._guard.stall_seconds:
            self._guard.unread()
            self.force_close()
            # force_close's close waits for the buffer the client is not reading.
            transport.abort()
            return
        self._acked = acked if waiting else None
        self._read_watch = self._loop.call_later(self._guard.header_timeout, self._check_reads)

    def force_close(self) -> None:
        transport = self.transport
        super().force_close()
        self._bound_close(transport)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp's handler loop logs what ends a request outside the application: a
        # body it drained after the answer that could not be read is the client's
        # (wrapped in RequestPayloadError by the C parser, bare by the Python one, whose
        # message quotes the client's bytes: rt53 R4).
        error = kw.get("exc_info")
        if isinstance(error, web.RequestPayloadError | HttpProcessingError):
            self._guard.bad_body(error)
            return
        super().log_exception(*args, **kw)

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as error:
            # aiohttp's handler loop ended on an error it did not expect, which leaves the
            # connection open, unanswered, past any deadline (rt52 F1 was one: since
            # answered by keysvc.http.dispatch). It is closed, and the error logged.
            self._guard.failed(error)
            if self.transport is not None:
                self.transport.close()
        # aiohttp closes the transport when its handler loop ends without force_close.
        self._bound_close(self.transport)

    def _bound_close(self, transport: asyncio.Transport | None) -> None:
        """A transport's close waits until what is buffered is written, which a
        client reading nothing makes forever: its connection, one of the capped
        number, was never lost (rt42 F1). Past the header timeout (and the linger,
        which delays a close) it is aborted."""
        if transport is not None and self._counted and self._close_deadline is None:
            self._close_deadline = self._loop.call_later(
                self._guard.header_timeout + LINGER_SECONDS, transport.abort
            )

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_deadline()
        if self._read_watch is not None:
            self._read_watch.cancel()
            self._read_watch = None
        if self._close_deadline is not None:
            self._close_deadline.cancel()
            self._close_deadline = None
        if self._counted:
            self._counted = False
            self._guard.open -= 1
        if self._tcp is not None:
            self._tcp = None
            self._guard.shares.give_back(self._network)
        super().connection_lost(exc)

    def _waiting_for_request(self) -> bool:
        # aiohttp's handler loop waits on this future between requests only.
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def _start_head_deadline(self) -> None:
        self._head_deadline = self._loop.call_later(self._guard.header_timeout, self._head_overdue)

    def _stop_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_overdue(self) -> None:
        self._head_deadline = None
        if self._waiting_for_request():
            self._guard.timed_out()
            self.force_close()
        else:
            # A request is being answered, and is not cut off: the head begun behind it
            # gets another timeout's time, counted from now.
            self._start_head_deadline()


class GuardedServer(web.Server):
    """``web.Server`` whose connections are ``GuardedHandler``s."""

    def __init__(self, plain: web.Server, guard: Guard):
        # Everything the application's runner chose, handler arguments included.
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        self.guard = guard

    def __call__(self) -> web.RequestHandler:
        return GuardedHandler(self, guard=self.guard, loop=self._loop, **self._kwargs)

    async def shutdown(self, timeout: float | None = None) -> None:
        """aiohttp's shutdown of the open connections, within ``timeout`` in all; then
        every one still open is aborted. aiohttp gives a handler ``timeout`` to finish,
        then as long again once cancelled, which a handler waiting to write to a client
        that reads nothing never finishes: twice the bound (rt45 R2-2). So each wait
        gets half of it; and a close that still waits on such a client is not left to
        the header timeout's abort (``GuardedHandler._bound_close``): the loop ends."""
        transports = list(self._connections.values())
        # Never 0: aiohttp takes a timeout of 0 for none.
        await super().shutdown(None if timeout is None else max(timeout, 0.02) / 2)
        for transport in transports:
            transport.abort()


class ServiceRunner(DispatchRunner):
    """``web.AppRunner`` for ``keysvc serve``: verifies answered through
    ``keysvc.http.dispatch``, the idle timeout, and connections guarded as ``settings``
    say (``GuardedHandler``). Making one fits the process's open-file limit and the
    connection cap to each other (``fit_open_files``)."""

    def __init__(self, app: web.Application, settings: Settings, **kwargs: Any):
        # What is left of a body the answer did not need is drained, so that the client
        # reads the answer, for no longer than the body itself could take to arrive.
        super().__init__(
            app,
            keepalive_timeout=settings.idle_timeout,
            lingering_time=settings.header_timeout,
            **kwargs,
        )
        max_connections = fit_open_files(settings.max_connections)
        reserve = unix_reserve(max_connections, settings.unix_path is not None, settings.tcp)
        shares = Shares(
            max_connections - reserve,
            settings.max_connections_per_address,
            settings.trusted_proxies,
        )
        self._guard = Guard(settings.header_timeout, max_connections, shares)

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self._guard)

    async def cleanup_within(self, seconds: float) -> None:
        """``cleanup``, with ``seconds`` in all for the connections still open to finish
        their answers (``GuardedServer.shutdown``), then the application's cleanup."""
        self._shutdown_timeout = seconds
        await self.cleanup()


def fit_open_files(max_connections: int) -> int:
    """How many connections may be open at once: ``max_connections``, after the
    soft limit on open files is raised to fit them (as far as the hard limit
    goes); fewer, with a warning, where the hard limit is lower. The cap then
    always refuses a connection before the process runs out of descriptors."""
    needed = max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections
    soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft >= needed:
        return max_connections
    fits = max(1, soft - SPARE_DESCRIPTORS)
    logger.warning(
        "the open-file limit, %d, leaves room for %d connections, not max-connections %d:"
        " raise LimitNOFILE (ulimit -n) to %d to allow them all",
        soft,
        fits,
        max_connections,
        needed,
        extra={"maxConnections": fits},
    )
    return fits
