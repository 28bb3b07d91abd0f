"""At the connection cap, a real ``keysvc serve`` lets a new connection in in place of
one that holds its slot for nobody (rt46 C1): kept alive and idle, or with answers its
client has left unread for long. Before, the new connection was always refused, so a
few clients reading a few hundred bytes a second (under the stall bound, which any
acknowledged byte resets) held every slot for as long as they liked, ``/healthz``
refused to everyone else. A connection receiving a head or being answered is never
closed for another (tests/system/test_connections.py, the cap's own test)."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from keysvc.http.connections import IDLE_ROOM_SECONDS, UNREAD_SECONDS
from tests.server import Server, bootstrap
from tests.system.rawconn import (
    HEALTHZ,
    PIPELINED,
    WITHIN,
    closed_by_server,
    connect,
    read_answer,
)

CAP = 3


@pytest.fixture(autouse=True)
def _database(tmp_path: Path) -> None:
    bootstrap(tmp_path / "k.db")


def _server(tmp_path: Path, loop: str = "asyncio") -> Server:
    env = {
        "KEYSVC_LOOP": loop,
        "KEYSVC_MAX_CONNECTIONS": str(CAP),
        "KEYSVC_HEADER_TIMEOUT": "1",
        "KEYSVC_IDLE_TIMEOUT": "600",
    }
    return Server(tmp_path / "k.db", env=env)


def _probe(port: int) -> int | None:
    """/healthz on a new connection: its status, or None when refused at the cap."""
    try:
        with connect(port, HEALTHZ) as sock:
            return read_answer(sock)[0]
    except (ConnectionError, AssertionError, TimeoutError):
        return None


def _logged(server: Server, text: str) -> None:
    """``text`` is in the server's log, once its writer has caught up (within WITHIN)."""
    deadline = time.monotonic() + WITHIN
    while text not in server.stderr_text():
        assert time.monotonic() < deadline, server.stderr_text()[-2000:]
        time.sleep(0.1)


@contextmanager
def _slow_readers(port: int, count: int, each_tenth: int) -> Iterator[list[socket.socket]]:
    """``count`` clients that pipeline requests without pause and read ``each_tenth``
    bytes every 0.1 s, from a small receive window."""
    stop = threading.Event()
    with ExitStack() as stack:
        clients = []
        for _ in range(count):
            client = stack.enter_context(socket.socket())
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", port))
            clients.append(client)

        def pipeline(client: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    client.sendall(PIPELINED * 200)

        def read(client: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set() and client.recv(each_tenth):
                    time.sleep(0.1)

        threads = [
            threading.Thread(target=work, args=(client,), daemon=True)
            for client in clients
            for work in (pipeline, read)
        ]
        for thread in threads:
            thread.start()
        try:
            yield clients
        finally:
            stop.set()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_slow_readers_holding_every_slot_make_room_for_a_new_connection(
    tmp_path: Path, loop: str
) -> None:
    """rt46 C1: clients reading 1 KB a second keep acknowledging something, so the stall
    bound never cuts them; at the cap, one of them gives its slot to a new connection
    once its answers have waited UNREAD_SECONDS, and /healthz answers."""
    with _server(tmp_path, loop) as server, _slow_readers(server.port, CAP, 100):
        started = time.monotonic()
        time.sleep(1.0)
        assert _probe(server.port) is None  # the cap is full, and nobody holds it long yet
        while (status := _probe(server.port)) is None:
            assert time.monotonic() - started < UNREAD_SECONDS + WITHIN, "still refused"
            time.sleep(0.5)
        assert status == 200
        assert time.monotonic() - started >= UNREAD_SECONDS - 1
        _logged(server, "held its slot for nobody")


def test_an_idle_kept_alive_connection_makes_room_at_the_cap(tmp_path: Path) -> None:
    """As nginx closes idle kept-alive connections when it runs out: the one idle the
    longest goes, and only once idle for IDLE_ROOM_SECONDS."""
    with _server(tmp_path) as server, ExitStack() as stack:
        idle = []
        for _ in range(CAP):
            sock = stack.enter_context(connect(server.port, HEALTHZ))
            assert read_answer(sock)[0] == 200
            idle.append(sock)
            time.sleep(0.3)
        # The newest has been idle under IDLE_ROOM_SECONDS, the oldest not yet either.
        assert _probe(server.port) is None
        time.sleep(IDLE_ROOM_SECONDS + 0.5)
        assert _probe(server.port) == 200
        assert closed_by_server(idle, 2.0, expected=1) == [idle[0]]
        # The others are kept, and still answer.
        for sock in idle[1:]:
            sock.sendall(HEALTHZ)
            assert read_answer(sock)[0] == 200


def test_a_connection_being_answered_is_not_closed_for_a_new_one(tmp_path: Path) -> None:
    """Connections that keep asking, each answer read at once, are never idle for
    long and never leave answers unread: a new connection is refused, as before."""
    with _server(tmp_path) as server, ExitStack() as stack:
        busy = [stack.enter_context(connect(server.port)) for _ in range(CAP)]
        stop = threading.Event()
        answered = [0] * CAP

        def ask(index: int) -> None:
            with contextlib.suppress(OSError, AssertionError):
                while not stop.is_set():
                    busy[index].sendall(HEALTHZ)
                    assert read_answer(busy[index])[0] == 200
                    answered[index] += 1
                    time.sleep(0.05)

        threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(CAP)]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + IDLE_ROOM_SECONDS + 2
            while time.monotonic() < deadline:
                assert _probe(server.port) is None
                time.sleep(0.2)
        finally:
            stop.set()
            for thread in threads:
                thread.join(WITHIN)
        assert all(count > 10 for count in answered), answered
        assert "held its slot for nobody" not in server.stderr_text()
