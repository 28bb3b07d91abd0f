"""The answers of one turn of the event loop, sent together at the start of the next.

A busy ``keysvc serve`` answers several connections in each turn of its loop (a
proxy's dozens of kept-alive connections, each waiting for its verify). asyncio sends
each answer the moment it is written: a ``send`` system call a request, and on
loopback each of them wakes the proxy to read one answer, then sleeps it again. Held
until the turn ends, the turn's answers go out back to back: the first send wakes the
proxy, which is still reading when the others arrive. In ``make bench`` this took a
verify's system time from about 17 to 6 us, and its rate up by a third
(docs/PERFORMANCE.md, "Session 43").

``Coalesced`` is a connection's transport that holds what is written to it until
``Writes`` sends it, from a callback the loop runs first in its next turn: no timer,
so an answer waits for the rest of its own turn at most, and an idle server sends each
answer one turn later than it would have. Nothing changes order: whatever one
connection wrote is sent in the order written and before anything that follows it
(``write_eof``, ``close``); a write of HOLD_BYTES or more, or to a transport that
already has unsent bytes of its own (a client reading slowly), is sent at once, the
held bytes first; ``abort`` drops them, as it drops the transport's own buffer. What a
connection holds counts in its ``get_write_buffer_size``, which the stall check
(``keysvc.http.connections``) reads.
"""

import asyncio
import logging
from typing import Any

logger = logging.getLogger("keysvc")

# Writes at least this long are not held (an answer this size costs more than its
# send), nor is more than this held for one connection.
HOLD_BYTES = 16 * 1024
# At most this many connections' answers are held at once: then they are sent, so that
# a turn of many answers sends its first ones while it makes the rest.
HOLD_ANSWERS = 16


class Writes:
    """The answers written by the connections of one server in one turn of the loop.

    Held only while turns answer more than one connection: a turn that answered one
    (a single client, a quiet hour) sends the next turn's answers at once, so that an
    answer nothing would have joined waits for no turn; a turn that answered several
    holds the next turn's, until a turn answers one again."""

    __slots__ = ("_counted", "_turn_ends", "_waiting", "holding")

    def __init__(self) -> None:
        self._waiting: list[Coalesced] = []
        self._counted = 0  # answers written this turn, held or not
        self._turn_ends = False  # whether the call that ends this turn is scheduled
        self.holding = False

    def count(self, loop: asyncio.AbstractEventLoop) -> None:
        """An answer written this turn, sent at once."""
        self._counted += 1
        if not self._turn_ends:
            self._turn_ends = True
            loop.call_soon(self.turn_ended)

    def hold(self, held: "Coalesced", loop: asyncio.AbstractEventLoop) -> None:
        """Send ``held``'s bytes with the rest of this turn's, or with the HOLD_ANSWERS
        held before it."""
        waiting = self._waiting
        waiting.append(held)
        self.count(loop)
        if len(waiting) >= HOLD_ANSWERS:
            self._waiting = []
            _send(waiting)

    def turn_ended(self) -> None:
        """Send every connection's held bytes, in the order they were first held; the
        next turn holds its answers if this one wrote more than one."""
        waiting, self._waiting = self._waiting, []
        self.holding = self._counted > 1
        self._counted = 0
        self._turn_ends = False
        _send(waiting)


def _send(waiting: "list[Coalesced]") -> None:
    for held in waiting:
        try:
            held.send()
        except Exception:  # one connection's failure must not keep the others' answers
            logger.exception("sending a held answer failed; its connection is aborted")
            held.abort()


class Coalesced:
    """A connection's transport whose small writes wait for the end of the loop's turn
    (``Writes``); every other call goes to the transport as it is."""

    __slots__ = ("_eof", "_held", "_loop", "_size", "_transport", "_writes")

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
        writes = self._writes
        if not writes.holding:
            writes.count(self._loop)
            transport.write(data)
            return
        self._held = [bytes(data)]
        self._size = len(data)
        writes.hold(self, self._loop)

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
