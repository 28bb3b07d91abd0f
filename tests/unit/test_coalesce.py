"""keysvc.http.coalesce on a real event loop, over a transport that records what is
written to it: what a turn of the loop writes is held and sent together at the start of
the next, in order, never after what follows it on its connection; only after a busy
turn, and never for longer than HOLD_SECONDS but by one long step, after which nothing
is held for CALM_SECONDS."""

import asyncio
import time
from time import thread_time
from typing import Any

import pytest

from keysvc.http import coalesce
from keysvc.http.coalesce import (
    HOLD_ANSWERS,
    HOLD_BYTES,
    HOLD_FROM,
    HOLD_SECONDS,
    Coalesced,
    Writes,
)


class Recording:
    """A transport that keeps, in order, what is done to it."""

    def __init__(self, buffered: int = 0, fails: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False
        self.eof = False
        self.buffered = buffered
        self.fails = fails

    def write(self, data: bytes) -> None:
        if self.eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if self.fails:
            raise OSError("the transport failed")
        self.calls.append(("write", bytes(data)))

    def write_eof(self) -> None:
        self.eof = True
        self.calls.append(("eof", None))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default


def _long_step(seconds: float) -> None:
    """Work on this thread for ``seconds`` of its CPU time, as another request's long
    synchronous step would (a sleep would not count: the bound is the loop's work)."""
    until = thread_time() + seconds
    while thread_time() < until:
        pass


async def _turn() -> None:
    """Let the loop run the turn after this one's callbacks."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _pair(writes: Writes) -> tuple[list[Recording], list[Coalesced]]:
    loop = asyncio.get_running_loop()
    raw = [Recording(), Recording()]
    return raw, [Coalesced(transport, writes, loop) for transport in raw]


async def _busy_turn(writes: Writes, answers: int = HOLD_FROM) -> list[Recording]:
    """``answers`` connections answered in one quick turn, each sent at once unless
    held; then the turn ends."""
    loop = asyncio.get_running_loop()
    raw = [Recording() for _ in range(answers)]
    for transport in raw:
        Coalesced(transport, writes, loop).write(b"answer")
    await _turn()
    return raw


async def _holding(writes: Writes) -> None:
    """A busy turn: the next one holds."""
    raw = await _busy_turn(writes)
    assert all(t.calls == [("write", b"answer")] for t in raw)
    assert writes.holding


async def _held_pair() -> tuple[Writes, list[Recording], list[Coalesced]]:
    """A Writes that holds (after a busy turn), and two connections on it."""
    writes = Writes()
    await _holding(writes)
    raw, wrapped = _pair(writes)
    return writes, raw, wrapped


async def test_a_turn_of_fewer_answers_than_hold_from_holds_nothing() -> None:
    writes = Writes()
    for _ in range(3):
        raw = await _busy_turn(writes, HOLD_FROM - 1)
        assert all(t.calls == [("write", b"answer")] for t in raw)  # sent as written
        assert not writes.holding


async def test_after_a_turn_of_several_the_answers_of_a_turn_go_out_together() -> None:
    writes, raw, wrapped = await _held_pair()
    wrapped[0].write(b"head-0 ")
    wrapped[1].write(b"head-1 ")
    wrapped[0].write(b"body-0")
    assert wrapped[0].get_write_buffer_size() == len(b"head-0 body-0")
    assert [t.calls for t in raw] == [[], []]  # held for the rest of the turn
    await _turn()
    # One write a connection, in the order written.
    assert [t.calls for t in raw] == [[("write", b"head-0 body-0")], [("write", b"head-1 ")]]
    assert wrapped[0].get_write_buffer_size() == 0
    assert not writes.holding  # that turn answered two: the next is not held
    raw2, wrapped2 = _pair(writes)
    wrapped2[0].write(b"alone")
    assert raw2[0].calls == [("write", b"alone")]


async def test_nothing_held_goes_after_what_follows_it() -> None:
    _, raw, wrapped = await _held_pair()
    wrapped[0].write(b"answer")
    wrapped[0].close()
    wrapped[1].write(b"answer")
    wrapped[1].write_eof()
    assert raw[0].calls == [("write", b"answer"), ("close", None)]
    assert raw[1].calls == [("write", b"answer"), ("eof", None)]
    # After write_eof a write is the transport's to refuse, at once, as it would have.
    with pytest.raises(RuntimeError):
        wrapped[1].write(b"more")
    await _turn()
    assert raw[0].calls[-1] == ("close", None) and raw[1].calls[-1] == ("eof", None)


async def test_a_large_write_goes_at_once_after_what_is_held() -> None:
    _, raw, wrapped = await _held_pair()
    wrapped[0].write(b"head ")
    large = b"x" * HOLD_BYTES
    wrapped[0].write(large)
    assert raw[0].calls == [("write", b"head "), ("write", large)]
    wrapped[1].write(large)  # nothing held before it: straight through
    assert raw[1].calls == [("write", large)]


async def test_a_connection_with_unsent_bytes_of_its_own_is_not_held() -> None:
    writes = Writes()
    await _holding(writes)
    loop = asyncio.get_running_loop()
    slow = Recording(buffered=1)
    Coalesced(slow, writes, loop).write(b"answer")
    assert slow.calls == [("write", b"answer")]


async def test_an_abort_drops_what_is_held() -> None:
    _, raw, wrapped = await _held_pair()
    wrapped[0].write(b"answer")
    wrapped[0].abort()
    wrapped[1].write(b"answer")
    raw[1].closing = True  # lost meanwhile
    await _turn()
    assert raw[0].calls == [("abort", None)]
    assert raw[1].calls == []


async def test_at_most_hold_answers_connections_wait_at_once() -> None:
    writes = Writes()
    await _holding(writes)
    loop = asyncio.get_running_loop()
    raw = [Recording() for _ in range(HOLD_ANSWERS + 1)]
    for transport in raw:
        Coalesced(transport, writes, loop).write(b"answer")
    assert [bool(t.calls) for t in raw] == [True] * HOLD_ANSWERS + [False]
    await _turn()
    assert all(t.calls == [("write", b"answer")] for t in raw)


async def _failing_and_fine() -> tuple[Recording, Recording]:
    """Two connections with answers held, the first's transport failing its writes."""
    writes = Writes()
    await _holding(writes)
    loop = asyncio.get_running_loop()
    failing, fine = Recording(), Recording()
    Coalesced(failing, writes, loop).write(b"answer")
    Coalesced(fine, writes, loop).write(b"answer")
    failing.fails = True
    return failing, fine


async def test_one_failing_transport_keeps_no_other_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing, fine = await _failing_and_fine()
    await _turn()
    assert failing.calls == [("abort", None)]
    assert fine.calls == [("write", b"answer")]
    assert "sending a held answer failed" in caplog.text


async def test_an_answer_held_past_hold_seconds_goes_with_the_next_write() -> None:
    _, raw, wrapped = await _held_pair()
    wrapped[0].write(b"first")
    assert raw[0].calls == []
    _long_step(HOLD_SECONDS * 2)  # another request's, in the same turn
    wrapped[1].write(b"second")
    assert raw[0].calls == [("write", b"first")] and raw[1].calls == [("write", b"second")]


async def test_a_turn_that_ran_long_stops_the_holding_for_calm_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coalesce, "CALM_SECONDS", 0.2)
    writes, raw, wrapped = await _held_pair()
    wrapped[0].write(b"held")
    _long_step(HOLD_SECONDS * 2)  # the turn runs long after it, and no write follows
    await _turn()
    assert raw[0].calls == [("write", b"held")]
    assert not writes.holding
    for _ in range(3):  # busy turns within the calm: nothing held
        assert all(t.calls for t in await _busy_turn(writes))
        assert not writes.holding
    await asyncio.sleep(0.25)
    await _busy_turn(writes)
    assert writes.holding


async def test_a_wait_that_is_not_the_loops_work_does_not_stop_the_holding() -> None:
    """The machine's other load, or a wait in the same turn that does no work (a sleep
    stands for both), does not count against the bound: only the loop's own work does."""
    writes, raw, wrapped = await _held_pair()
    wrapped[0].write(b"first")
    time.sleep(HOLD_SECONDS * 2)
    wrapped[1].write(b"second")
    assert [t.calls for t in raw] == [[], []]  # both held still
    await _turn()
    assert [t.calls for t in raw] == [[("write", b"first")], [("write", b"second")]]
    await _busy_turn(writes)
    assert writes.holding  # no calm


async def test_an_abort_that_raises_keeps_no_other_answer() -> None:
    failing, fine = await _failing_and_fine()

    def abort() -> None:
        raise OSError("abort failed too")

    failing.abort = abort  # type: ignore[method-assign]
    await _turn()
    assert fine.calls == [("write", b"answer")]


async def test_loop_sendfile_is_refused_rather_than_put_ahead_of_held_bytes(
    tmp_path: Any,
) -> None:
    """asyncio's sendfile writes to the socket itself: through a Coalesced it would put
    a file ahead of what is held (rt56 L3), so it is refused; what is held still goes."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            accepted.set_result(transport)

    server = await loop.create_server(Server, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writes = Writes()
        await _holding(writes)
        coalesced = Coalesced(await accepted, writes, loop)
        coalesced.write(b"head ")
        file = tmp_path / "body"
        file.write_bytes(b"body")
        with file.open("rb") as body, pytest.raises(RuntimeError, match="not supported"):
            await loop.sendfile(coalesced, body)  # type: ignore[arg-type]
        coalesced.write(b"tail")
        await _turn()
        assert await asyncio.wait_for(reader.readexactly(9), 5) == b"head tail"
        coalesced.close()
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_batch_of_ordinary_answers_on_a_slow_machine_keeps_the_holding() -> None:
    """HOLD_ANSWERS answers of 150 us of the loop's work each (about a verify's CPU on
    the slowest day measured: 90 to 140 us a request, from /proc; 2.4 ms in all) are
    held and sent together, and the holding goes on: the bound is for another request's
    long step, not a batch of ordinary ones. At 2 ms, batches of 7 to 13 verifies
    stopped the holding for a second once or twice a 5 s round, some 5% of a plain
    verify's rate each time (docs/PERFORMANCE.md, "Session 44")."""
    writes = Writes()
    await _holding(writes)
    loop = asyncio.get_running_loop()
    raw = [Recording() for _ in range(HOLD_ANSWERS)]
    for transport in raw:
        _long_step(0.000150)
        Coalesced(transport, writes, loop).write(b"answer")
    assert all(t.calls == [("write", b"answer")] for t in raw)  # sent at the cap
    assert writes.holding  # no calm
    await _busy_turn(writes)
    assert writes.holding
