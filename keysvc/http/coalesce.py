"""The answers of a busy turn of the event loop, sent together at the start of the next.

A busy ``keysvc serve`` answers several connections in each turn of its loop (a
proxy's dozens of kept-alive connections, each waiting for its verify). asyncio sends
each answer the moment it is written: a ``send`` system call a request, and on
loopback each of them wakes the proxy to read one answer, then sleeps it again. Held
until the turn ends, the turn's answers go out back to back: the first send wakes the
proxy, which is still reading when the others arrive. Under wrk's 32 connections this
took a verify's system time from about 17 to 6 us, and its rate up by a fifth to a
third (docs/PERFORMANCE.md, "Session 43").

``Coalesced`` is a connection's transport that holds what is written to it until
``Writes`` sends it, from a callback the loop runs first in its next turn (no timer).
Only while the loop is busy (``Writes``: after a turn of HOLD_FROM answers or more);
never while the loop does more than HOLD_SECONDS of its own work, and an answer that
waited longer (behind another request's long step: nothing in a turn can be cut short)
stops the holding for CALM_SECONDS. Nothing changes order: whatever one connection
wrote is sent in the order written and before anything that follows it (``write_eof``,
``close``, and the transport's own close at the client's end of input:
``keysvc.http.connections.GuardedHandler.eof_received``); a write of HOLD_BYTES or more,
or to a transport that already has unsent bytes of its own (a client reading slowly),
is sent at once, the held bytes first; ``abort`` drops them, as it drops the
transport's own buffer. What a connection holds counts in its
``get_write_buffer_size``, which the stall check (``keysvc.http.connections``) reads.
"""

import asyncio
import contextlib
import logging
from asyncio import constants
from time import thread_time
from typing import Any

logger = logging.getLogger("keysvc")

# Writes at least this long are not held (an answer this size costs more than its
# send), nor is more than this held for one connection.
HOLD_BYTES = 16 * 1024
# At most this many connections' answers are held at once: then they are sent, so that
# a turn of many answers sends its first ones while it makes the rest.
HOLD_ANSWERS = 16
# A turn that wrote at least this many answers holds the next turn's: a loop that busy
# is behind its clients, and an answer held costs its client less than the queue does.
HOLD_FROM = 4
# No answer is held while the loop does more than this of its own work (its thread's
# CPU time, which the machine's other load does not move): at a later write past it the
# batch is sent. An answer that waited longer (another request's long synchronous step
# came after it: a large page, say) stops all holding for CALM_SECONDS of the loop's
# clock, so that no one's long steps keep others' answers back more than once a
# CALM_SECONDS (rt55 F1). Above what a batch of ordinary answers takes: on a slow day,
# batches of 7 to 13 held verifies passed 2 ms (2.4 to 2.6) and stopped the holding.
HOLD_SECONDS = 0.005
CALM_SECONDS = 1.0


class Writes:
    """The answers written by the connections of one server in one turn of the loop.

    Held only while the loop is busy: after a turn that wrote HOLD_FROM answers or more,
    and not within CALM_SECONDS of an answer held past HOLD_SECONDS of the loop's work.
    Otherwise each answer is sent as it is written: a single client, a few, a quiet
    hour, or turns made long by slow steps are not held."""

    __slots__ = (
        "_calm_until",
        "_counted",
        "_held_since",
        "_turn_ends",
        "_waiting",
        "holding",
    )

    def __init__(self) -> None:
        self._waiting: list[Coalesced] = []
        self._held_since = 0.0  # the loop thread's CPU time when the first waiting was held
        self._counted = 0  # answers written this turn, held or not
        self._turn_ends = False  # whether the call that ends this turn is scheduled
        self._calm_until = float("-inf")  # nothing is held before then
        self.holding = False

    def count(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Count an answer written this turn; whether it is to be held (``hold``), else
        it is for the caller to send now."""
        if not self._turn_ends:
            self._turn_ends = True
            loop.call_soon(self.turn_ended, loop)
        self._counted += 1
        return self.holding

    def hold(self, held: "Coalesced", loop: asyncio.AbstractEventLoop) -> None:
        """Send ``held``'s bytes with the rest of the turn's (``count`` said to hold it)."""
        waiting = self._waiting
        if not waiting:
            self._held_since = thread_time()
        elif self._held_too_long():
            self._calm(loop.time())
        waiting.append(held)
        if len(waiting) >= HOLD_ANSWERS or not self.holding:
            self._waiting = []
            _send(waiting)

    def _held_too_long(self) -> bool:
        """Whether the loop has done more than HOLD_SECONDS of its own work since the
        first of the answers waiting was held."""
        return thread_time() - self._held_since > HOLD_SECONDS

    def _calm(self, now: float) -> None:
        """An answer was held past HOLD_SECONDS (``now``: the loop's clock): none is
        held for CALM_SECONDS."""
        self._calm_until = now + CALM_SECONDS
        self.holding = False

    def turn_ended(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send every connection's held bytes, in the order they were first held, and
        decide whether the next turn holds."""
        waiting, self._waiting = self._waiting, []
        now = loop.time()
        if waiting and self._held_too_long():
            self._calm(now)
        self.holding = self._counted >= HOLD_FROM and now >= self._calm_until
        self._counted = 0
        self._turn_ends = False
        _send(waiting)


def _send(waiting: "list[Coalesced]") -> None:
    for held in waiting:
        try:
            held.send()
        except Exception:  # one connection's failure must not keep the others' answers
            logger.exception("sending a held answer failed; its connection is aborted")
            with contextlib.suppress(Exception):  # nor its abort's (rt55 F3)
                held.abort()


class Coalesced:
    """A connection's transport whose small writes wait for the end of the loop's turn
    (``Writes``); every other call goes to the transport as it is."""

    __slots__ = ("_eof", "_held", "_loop", "_size", "_transport", "_writes")

    # asyncio's loop.sendfile would write a file to the socket itself, ahead of what is
    # held (rt56 L3): refused here rather than passed to the transport. keysvc sends no
    # file (no FileResponse).
    _sendfile_compatible = constants._SendfileMode.UNSUPPORTED

    def __init__(self, transport: Any, writes: Writes, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._writes = writes
        self._loop = loop
        self._held: list[bytes] | None = None  # None: nothing held, nor waiting to be sent
        self._size = 0
        self._eof = False  # write_eof was called: a write raises as the transport's does

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            if len(data) >= HOLD_BYTES:  # sent at once, what is held first, no copy
                self.send()
                self._transport.write(data)
                return
            held.append(bytes(data))
            self._size += len(data)
            if self._size >= HOLD_BYTES:
                self.send()
            return
        transport = self._transport
        if (
            len(data) >= HOLD_BYTES
            or self._eof
            or transport.is_closing()
            or transport.get_write_buffer_size()
        ):
            transport.write(data)  # raises, or drops, as the transport itself would
            return
        if not self._writes.count(self._loop):
            transport.write(data)
            return
        self._held = [bytes(data)]
        self._size = len(data)
        self._writes.hold(self, self._loop)

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def send(self) -> None:
        """Write what is held to the transport, in one write."""
        held = self._held
        if held is None:
            return
        self._held, self._size = None, 0
        transport = self._transport
        if transport.is_closing():
            return  # lost or aborted meanwhile: asyncio would drop it too
        transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        unsent: int = self._transport.get_write_buffer_size()
        return self._size + unsent

    def is_closing(self) -> bool:  # asked before every write aiohttp makes
        closing: bool = self._transport.is_closing()
        return closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:  # asked per request
        return self._transport.get_extra_info(name, default)

    def write_eof(self) -> None:
        self.send()
        self._eof = True
        self._transport.write_eof()

    def close(self) -> None:
        self.send()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._size = None, 0
        self._transport.abort()
