"""A head keysvc's parser refuses, from a client still sending it (Caddy's forward_auth
passes keysvc every client header; rt41 R1): `keysvc serve` answers its 400 envelope,
then reads and drops the rest until the client closes, rather than close a socket with
bytes unread, which resets the connection: the client's next write failed, and a proxy
made keysvc's answer its own 502 (the Caddyfile's 503)."""

import json
import select
import socket
import time
from pathlib import Path

from tests.server import Server, bootstrap

# More header lines than keysvc reads (128), in the first part of the head.
FIRST = b"GET /v1/verify HTTP/1.1\r\nHost: keysvc\r\n" + b"".join(
    f"X-Part-{n}: v\r\n".encode() for n in range(300)
)
REST = b"".join(f"X-Rest-{n}: v\r\n".encode() for n in range(3_000)) + b"\r\n"


def _answer_then_rest(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(10)
        client.connect(str(path))
        client.sendall(FIRST)
        readable, _, _ = select.select([client], [], [], 10)
        assert readable, "no answer in 10 s"
        time.sleep(0.3)  # keysvc has answered, and (before) closed
        client.sendall(REST)  # a reset connection: BrokenPipeError / ConnectionResetError
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        return answer


def test_a_refused_head_is_answered_and_the_rest_read_never_reset(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    sock = tmp_path / "keysvc.sock"
    with Server(db, unix=sock, tcp=False):
        for _ in range(3):
            answer = _answer_then_rest(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400", answer[:300]
            envelope = json.loads(body)
            assert envelope["status"] == 400 and envelope["requestId"], envelope


def test_what_is_read_after_a_refused_head_is_bounded(tmp_path: Path) -> None:
    """The rest is read and dropped up to LINGER_BYTES, not for all of LINGER_SECONDS at
    whatever rate the client can send (rt42 F2): past it the connection is closed."""
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    path = tmp_path / "keysvc.sock"
    chunk = b"X-More: " + b"v" * 65_000 + b"\r\n"
    sent = 0
    with (
        Server(db, unix=path, tcp=False),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client,
    ):
        client.settimeout(10)
        client.connect(str(path))
        client.sendall(FIRST)
        readable, _, _ = select.select([client], [], [], 10)
        assert readable, "no answer in 10 s"
        started = time.monotonic()
        try:
            while time.monotonic() - started < 30:
                sent += client.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    # The limit, and what the two sockets' buffers hold besides; a client unbounded
    # sent gigabytes in the 2 s.
    assert sent < 32 * 1024 * 1024, sent
