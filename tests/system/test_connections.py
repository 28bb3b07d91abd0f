"""The connections of a real ``keysvc serve``: a deadline for each request's
head, an idle timeout between requests, a cap on open connections that
refuses the rest at once and says so in a few log lines; and a request whose
framing cannot be trusted answered, then its connection closed.

Timing here is generous on purpose: a deadline is checked to have passed, and
what must close is waited for up to ``WITHIN`` seconds, far more than needed.
"""

import contextlib
import resource
import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from keysvc.config import Settings, build_settings
from keysvc.errors import BadFraming
from keysvc.http.connections import (
    LOG_INTERVAL_SECONDS,
    SEND_BUFFER_BYTES,
    SPARE_DESCRIPTORS,
    STALLED_SECONDS,
)
from tests.server import Server, admin_creds, bootstrap
from tests.system.rawconn import (
    HEALTHZ,
    PARTIAL,
    PIPELINED,
    SOURCES,
    WITHIN,
    answers_again,
    closed_by_server,
    connect,
    connections,
    healthz,
    read_answer,
    send_queue,
    wait_for_log,
)


@pytest.fixture(autouse=True)
def _database(tmp_path: Path) -> None:
    """The database each test's server serves, made as `keysvc bootstrap` makes it."""
    bootstrap(tmp_path / "k.db")


def test_a_silent_partial_request_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    env = {"KEYSVC_HEADER_TIMEOUT": "1", "KEYSVC_IDLE_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env) as server, connect(server.port, PARTIAL) as sock:
        started = time.monotonic()
        assert closed_by_server([sock], WITHIN) == [sock]
        assert time.monotonic() - started >= 0.9
        assert len(wait_for_log(server, "header-timeout")) == 1


def test_the_header_timeout_counts_from_the_first_byte_of_each_request(tmp_path: Path) -> None:
    """Requests on one connection over longer than the header timeout are all
    answered; a partial one after them is cut off, long before the idle timeout."""
    env = {"KEYSVC_HEADER_TIMEOUT": "1", "KEYSVC_IDLE_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env) as server, connect(server.port) as sock:
        for _ in range(4):
            time.sleep(0.5)
            sock.sendall(HEALTHZ)
            status, _, _ = read_answer(sock)
            assert status == 200
        sock.sendall(PARTIAL)
        started = time.monotonic()
        assert closed_by_server([sock], WITHIN) == [sock]
        assert time.monotonic() - started >= 0.9


def test_a_partial_head_sent_behind_a_whole_request_gets_the_header_timeout(
    tmp_path: Path,
) -> None:
    """A whole request and the start of the next in one segment: the first is answered,
    and the partial one behind it is cut off after the header timeout, not left to the
    idle timeout. Bytes that arrive while a request is answered are the same."""
    env = {"KEYSVC_HEADER_TIMEOUT": "1", "KEYSVC_IDLE_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env) as server:
        for sending in ([HEALTHZ + PARTIAL], [HEALTHZ, PARTIAL]):
            with connect(server.port) as sock:
                for data in sending:
                    sock.sendall(data)
                started = time.monotonic()
                status, _, rest = read_answer(sock)
                assert (status, rest) == (200, b"")
                assert closed_by_server([sock], 10) == [sock]
                assert time.monotonic() - started < 10


def test_a_kept_alive_connection_after_a_body_is_left_to_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """A request whose body came in a segment of its own, then nothing: the connection
    is idle, not in the middle of a head, and stays open past the header timeout."""
    env = {"KEYSVC_HEADER_TIMEOUT": "1", "KEYSVC_IDLE_TIMEOUT": "600"}
    body = b'{"name": "x"}'
    head = (
        b"POST /v1/organizations/00000000-0000-4000-8000-000000000000/keys HTTP/1.1\r\n"
        b"Host: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with Server(tmp_path / "k.db", env=env) as server, connect(server.port, head) as sock:
        time.sleep(0.2)
        sock.sendall(body)
        status, _, _ = read_answer(sock)
        assert status == 401
        assert closed_by_server([sock], 3) == []
        sock.sendall(HEALTHZ)
        assert read_answer(sock)[0] == 200


def test_a_body_that_stops_arriving_gets_a_408_and_the_connection_closes(
    tmp_path: Path,
) -> None:
    """Whole headers, then part of the body and nothing more: after the header timeout
    the request is answered 408 in the envelope and its connection closed, rather than
    held open, one of the capped number, for as long as the client likes."""
    admin = admin_creds(bootstrap(tmp_path / "b.db"))
    env = {"KEYSVC_HEADER_TIMEOUT": "1", "KEYSVC_IDLE_TIMEOUT": "600"}
    head = (
        f"POST /v1/organizations/{admin.organization_id}/keys HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {admin.headers['Authorization']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    with Server(tmp_path / "b.db", env=env) as server:
        with connect(server.port, head + b'{"name": ') as sock:
            started = time.monotonic()
            status, body, _ = read_answer(sock)
            assert time.monotonic() - started >= 0.9
            assert (status, body["status"], body["error"]) == (
                408,
                408,
                "body: not received within 1 s",
            )
            assert closed_by_server([sock], 5) == [sock]
        assert healthz(server.port) == 200


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    env = {"KEYSVC_IDLE_TIMEOUT": "1"}
    with Server(tmp_path / "k.db", env=env) as server, connect(server.port, HEALTHZ) as sock:
        status, _, _ = read_answer(sock)
        assert status == 200
        started = time.monotonic()
        assert closed_by_server([sock], WITHIN) == [sock]
        assert time.monotonic() - started >= 0.9


def test_connections_over_the_cap_are_closed_at_once_and_logged_once(tmp_path: Path) -> None:
    cap, opened = 50, 80
    env = {"KEYSVC_MAX_CONNECTIONS": str(cap), "KEYSVC_HEADER_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env) as server:
        with connections(server.port, opened, PARTIAL) as socks:
            closed = closed_by_server(socks, WITHIN, opened - cap)
            assert len(closed) == opened - cap
            # The ones kept are not closed later either: nothing times them out here.
            kept = [sock for sock in socks if sock not in closed]
            assert closed_by_server(kept, 1.0) == []
        answers_again(server.port)
        # One line as the cap is reached, then one that counts the rest, at the
        # end of the interval.
        wait_for_log(server, "more connections", LOG_INTERVAL_SECONDS + WITHIN)
        about_refusals = wait_for_log(server, "refus")
    assert [line["level"] for line in about_refusals] == ["warning", "warning"]
    first, summary = about_refusals
    assert first["openConnections"] == cap
    assert summary["leftOut"] == opened - cap - 1


def until_closed(sock: socket.socket) -> bytes:
    """What the server sends before it closes the connection (it must, within WITHIN)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_http_1_0_with_transfer_encoding_is_400_and_closes(tmp_path: Path) -> None:
    """RFC 9112, section 6.1: the framing of such a message is faulty. The request
    pipelined behind it is never served, whether or not the first asks to be kept alive."""
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with Server(tmp_path / "k.db") as server:
        for keep_alive in (b"", b"Connection: keep-alive\r\n"):
            request = (
                b"POST /v1/verify HTTP/1.0\r\nHost: x\r\n"
                + keep_alive
                + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                + smuggled
            )
            with connect(server.port, request) as sock:
                status, body, rest = read_answer(sock)
                assert status == 400, body
                assert set(body) == {"status", "error", "requestId"}
                assert str(body["error"]).startswith("malformed HTTP request: ")
                if keep_alive:  # the parser lets this one through; keysvc refuses it
                    assert body["error"] == BadFraming.default_message
                assert rest + until_closed(sock) == b""


def test_serve_raises_its_open_file_limit_to_fit_the_connection_cap(tmp_path: Path) -> None:
    """Started under a low soft limit (a shell's ``ulimit -n``), ``keysvc serve``
    raises it as far as the default cap needs, so refusing at the cap comes before
    running out of descriptors."""
    needed = Settings().max_connections + SPARE_DESCRIPTORS
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard == resource.RLIM_INFINITY or hard >= needed, "the hard limit is too low here"

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    with Server(tmp_path / "k.db", preexec=low_soft_limit) as server:
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text().splitlines()
    (open_files,) = [line for line in limits if line.startswith("Max open files")]
    assert int(open_files.split()[3]) == needed


def test_connection_settings_from_flags_and_env() -> None:
    defaults = build_settings(env={})
    assert (defaults.header_timeout, defaults.idle_timeout, defaults.max_connections) == (
        10.0,
        75.0,
        1000,
    )
    env = {"KEYSVC_HEADER_TIMEOUT": "2.5", "KEYSVC_MAX_CONNECTIONS": "50"}
    chosen = build_settings({"idle_timeout": "30"}, env=env)
    assert (chosen.header_timeout, chosen.idle_timeout, chosen.max_connections) == (2.5, 30, 50)


def test_under_a_low_hard_limit_the_cap_shrinks_to_fit(tmp_path: Path) -> None:
    """Where the hard limit on open files is too low for max-connections, the cap
    is lowered to what fits, and says so: connections past it are refused, none
    fails for want of a descriptor."""
    limit = SPARE_DESCRIPTORS + 100
    fits = limit - SPARE_DESCRIPTORS

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    env = {"KEYSVC_HEADER_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env, preexec=low_limit) as server:
        (warning,) = wait_for_log(server, "open-file limit")
        assert warning["level"] == "warning" and warning["maxConnections"] == fits
        with connections(server.port, limit, PARTIAL) as socks:
            closed = closed_by_server(socks, WITHIN, len(socks) - fits)
            assert len(closed) == len(socks) - fits
            kept = [sock for sock in socks if sock not in closed]
            assert closed_by_server(kept, 1.0) == []
        answers_again(server.port)
        text = server.stderr_text()
    assert "Too many open files" not in text and "out of system resource" not in text


# A client that pipelines requests and never reads (rt42 F1): answers, 401s and 429s with
# no key needed, to fill its small receive window and the kernel's send buffer.
# By when, from its connection, such a client has lost it at a header timeout of 1 s: the
# stall bound, counted from the first check that saw answers waiting, one interval in;
# then a margin for the check's phase and a loaded machine.
UNREAD_WITHIN = STALLED_SECONDS + 1 + 5


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize(
    ("requests", "idle_timeout"),
    [
        # More answers than the kernel holds: keysvc's writes pause mid-answer.
        (30_000, "600"),
        # Fewer: all are written but the last few KB, and the idle timeout's close
        # waited for those forever; now it is aborted after the header timeout and
        # the linger, about 4 s in. On loopback 200 to 290 of these answers do that
        # (150 all fit in the kernel's queue; from 320 keysvc's writes wait, and the
        # stall bound frees the slot, as above).
        (240, "1"),
    ],
)
def test_a_client_that_never_reads_its_answers_loses_its_connection(
    tmp_path: Path, loop: str, requests: int, idle_timeout: str
) -> None:
    """Its connection is aborted within the stall bound (STALLED_SECONDS here), or the
    header timeout plus the linger after the idle timeout's close: the slot it held
    under max-connections comes back, where before it was held for as long as the
    client kept the socket."""
    env = {
        "KEYSVC_LOOP": loop,
        "KEYSVC_MAX_CONNECTIONS": "1",
        "KEYSVC_HEADER_TIMEOUT": "1",
        "KEYSVC_IDLE_TIMEOUT": idle_timeout,
    }
    with Server(tmp_path / "k.db", env=env) as server:
        with socket.socket() as hog:
            hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            hog.connect(("127.0.0.1", server.port))
            connected = time.monotonic()
            hog.settimeout(5)
            # Aborted, or keysvc reading no more: either way, what follows.
            with contextlib.suppress(ConnectionError, TimeoutError):
                hog.sendall(PIPELINED * requests)
            answers_again(server.port, connected + UNREAD_WITHIN)
        if requests == 30_000:
            (line,) = wait_for_log(server, "none of its answers")
            assert line["level"] == "info"


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_many_clients_that_never_read_lose_their_connections_together(
    tmp_path: Path, loop: str
) -> None:
    """Twenty at once, every slot (rt43 G1): keysvc answers them all as fast as it can,
    into send queues the kernel grows to megabytes, and their writes never pause within
    the bound; still each is aborted once the stall bound passes with nothing acknowledged."""
    count = 20
    env = {
        "KEYSVC_LOOP": loop,
        "KEYSVC_MAX_CONNECTIONS": str(count),
        "KEYSVC_HEADER_TIMEOUT": "1",
        "KEYSVC_IDLE_TIMEOUT": "600",
    }
    with Server(tmp_path / "k.db", env=env) as server, ExitStack() as stack:
        hogs = []
        connected = time.monotonic()
        for n in range(count):
            hog = stack.enter_context(socket.socket())
            hog.bind((SOURCES[n % len(SOURCES)], 0))
            hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            hog.connect(("127.0.0.1", server.port))
            hog.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                hog.send(PIPELINED * 5_000)
            hogs.append(hog)
        # Every slot back (the hogs are never read from: reading would make them readers).
        while not every_slot_answers(server.port, count):
            assert time.monotonic() < connected + UNREAD_WITHIN, "slots still held"
            time.sleep(0.5)


def every_slot_answers(port: int, count: int) -> bool:
    """Whether ``count`` connections, open at once, are each answered."""
    try:
        with connections(port, count, HEALTHZ) as socks:
            return all(read_answer(sock)[0] == 200 for sock in socks)
    except (ConnectionError, AssertionError):
        return False


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize(
    ("receive_buffer", "each_tenth", "header_timeout", "seconds"),
    [
        # 3 KB a second from a small receive window (rt43 G2: a check on paused writes
        # cut off such readers, even at 20 to 60 KB a second).
        (4096, 300, "3", 15),
        # 40 KB a second from the default one, which on loopback reopens its window
        # only when half of it is free: whole seconds with nothing acknowledged
        # (rt44 H1: a check for 1 KiB an interval cut such readers off).
        (0, 4_000, "2", 15),
        # 10 KB a second from the default one: its window reopens a 64 KB segment at a
        # time, every 6.4 s, more than two intervals (rt45 R2-1: a check for any byte
        # in two intervals cut such readers off, every run).
        (0, 1_000, "3", 40),
    ],
)
def test_a_client_reading_its_pipelined_answers_slowly_keeps_its_connection(
    tmp_path: Path,
    loop: str,
    receive_buffer: int,
    each_tenth: int,
    header_timeout: str,
    seconds: float,
) -> None:
    """A client that reads steadily but slowly, while it pipelines without pause: never
    cut off."""
    env = {
        "KEYSVC_LOOP": loop,
        "KEYSVC_HEADER_TIMEOUT": header_timeout,
        "KEYSVC_IDLE_TIMEOUT": "600",
    }
    with Server(tmp_path / "k.db", env=env) as server, socket.socket() as client:
        if receive_buffer:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        client.connect(("127.0.0.1", server.port))
        stop = threading.Event()

        def pipeline() -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    client.sendall(PIPELINED * 1_000)

        sender = threading.Thread(target=pipeline, daemon=True)
        sender.start()
        read = 0
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                chunk = client.recv(each_tenth)
                assert chunk, f"closed after {time.monotonic() - started:.1f} s, {read} B read"
                read += len(chunk)
                time.sleep(0.1)
        finally:
            stop.set()
        assert "none of its answers" not in server.stderr_text()


def test_a_slow_reader_holds_a_bounded_send_queue(tmp_path: Path) -> None:
    """A client that pipelines and reads nothing (yet) fills keysvc's send queue no
    further than SEND_BUFFER_BYTES (the kernel doubles it): before, Linux grew it to
    megabytes a connection, and a cap's worth of slow readers held gigabytes (rt44 H2)."""
    env = {"KEYSVC_HEADER_TIMEOUT": "600", "KEYSVC_IDLE_TIMEOUT": "600"}
    with Server(tmp_path / "k.db", env=env) as server, socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", server.port))
        client.settimeout(5)
        with contextlib.suppress(TimeoutError):
            client.sendall(PIPELINED * 20_000)
        port = client.getsockname()[1]
        highest = 0
        for _ in range(30):
            highest = max(highest, send_queue(server.port, port))
            time.sleep(0.1)
        assert 0 < highest <= 2 * SEND_BUFFER_BYTES + 65536, highest
