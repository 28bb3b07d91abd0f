"""Raw TCP clients of a real ``keysvc serve``, for the connection tests
(tests/system/test_connections.py, test_connection_shares.py, test_shutdown_bound.py):
requests written byte for byte, answers read by hand, and the kernel's view of a
connection."""

import json
import selectors
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.server import Server

WITHIN = 30.0
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
PARTIAL = b"GET /healthz HT"


def connect(port: int, data: bytes = b"", source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WITHIN, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if data:
        sock.sendall(data)
    return sock


# Loopback addresses the connections of one test take turns to come from (Linux answers
# all of 127.0.0.0/8 on loopback): a test that fills the connection cap stands for many
# clients, not one address past its share (keysvc.http.shares).
SOURCES = tuple(f"127.0.0.{n}" for n in range(1, 5))


@contextmanager
def connections(port: int, count: int, data: bytes) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(connect(port, data, SOURCES[n % len(SOURCES)]))
            for n in range(count)
        ]


def read_answer(sock: socket.socket) -> tuple[int, dict[str, object], bytes]:
    """One answer: its status, its JSON body, and what came in after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    return int(lines[0].split()[1]), json.loads(rest[:length]), rest[length:]


def closed_by_server(
    socks: list[socket.socket], within: float, expected: int | None = None
) -> list[socket.socket]:
    """The sockets among ``socks`` the server closes within ``within`` seconds, or
    as soon as ``expected`` of them (default: all) are closed."""
    expected = len(socks) if expected is None else expected
    closed: list[socket.socket] = []
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + within
        while len(closed) < expected and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    closed.append(sock)
    return closed


def healthz(port: int) -> int:
    with connect(port, HEALTHZ) as sock:
        status, _, _ = read_answer(sock)
        return status


def answers_again(port: int, deadline: float | None = None) -> None:
    """Once the load is gone, /healthz answers again, on a connection of its own (by
    ``deadline``, on time.monotonic's clock: within WITHIN by default)."""
    deadline = time.monotonic() + WITHIN if deadline is None else deadline
    while True:
        try:
            assert healthz(port) == 200
            return
        except (ConnectionError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# A request that needs no key (its answer a 401), pipelined by the clients that read slowly
# or never.
PIPELINED = b"GET /v1/verify HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer x\r\n\r\n"


def log_lines(server: Server) -> list[dict[str, object]]:
    return [json.loads(line) for line in server.stderr_text().splitlines()]


def wait_for_log(server: Server, text: str, within: float = WITHIN) -> list[dict[str, object]]:
    """The log lines whose message holds ``text``, once there is one (the log is
    written off the loop's thread)."""
    deadline = time.monotonic() + within
    while not (lines := [line for line in log_lines(server) if text in str(line["message"])]):
        assert time.monotonic() < deadline, server.stderr_text()
        time.sleep(0.1)
    return lines


def send_queue(server_port: int, client_port: int) -> int:
    """The bytes in the kernel's send queue of keysvc's end of one loopback connection
    (/proc/net/tcp: local address, remote address, then tx_queue:rx_queue, in hex)."""
    wanted = (f":{server_port:04X}", f":{client_port:04X}")
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(wanted[0]) and fields[2].endswith(wanted[1]):
            return int(fields[4].split(":")[0], 16)
    raise AssertionError("no such connection")
