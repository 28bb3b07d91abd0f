"""Requests aiohttp could not make or read, from clients that may send them at will.

An absolute-form request target whose host cannot be decoded (``GET http://xn--zz/
HTTP/1.1``) is answered 400 in the envelope and its connection closed: aiohttp's request
for it raised, which ended the connection's handler without an answer and left the
connection open past every deadline, so that anyone could hold every connection slot
with one line a connection and /healthz was refused (rt52 F1).

A body keysvc's view left unread that cannot be read as it is drained (it claims a
Content-Encoding it is not in) is logged at most once an interval, with no traceback.
aiohttp logged an error-level traceback for each, on any route that reads no body, with
no key needed (rt52 F3)."""

import json
import time
from pathlib import Path

import pytest

from tests.server import Server, bootstrap
from tests.system.rawconn import closed_by_server, connect, connections, healthz, read_answer

UNREADABLE = b"GET http://xn--zz/healthz HTTP/1.1\r\nHost: x\r\n\r\n"
CAP = 12
BAD_GZIP = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"
REQUESTS = 12


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_unreadable_target_is_answered_400_and_closed(tmp_path: Path, loop: str) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, env={"KEYSVC_LOOP": loop}) as server:
        for path in (b"/healthz", b"/v1/verify", b"/"):
            with connect(server.port, UNREADABLE.replace(b"/healthz", path, 1)) as sock:
                status, body, _ = read_answer(sock)
                assert status == 400
                assert body["error"] == "malformed HTTP request: invalid URL", body
                assert closed_by_server([sock], 5.0) == [sock]
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []


def test_unreadable_targets_hold_no_connection_slots(tmp_path: Path) -> None:
    """Twice the cap of them, from several addresses: each is answered and closed, and
    /healthz still answers."""
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, args=("--max-connections", str(CAP))) as server:
        for _ in range(2):
            with connections(server.port, CAP, UNREADABLE) as socks:
                assert len(closed_by_server(socks, 5.0)) == CAP
        started = time.monotonic()
        assert healthz(server.port) == 200
        assert time.monotonic() - started < 5.0


# A chunk-size line that is no number, sent once the answer is in: it comes as the body
# no view reads is drained.
BAD_CHUNK = b"GET %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
BAD_CHUNK_BODY = b"zz" + b"A" * 400 + b"\r\nabc\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    ("loop", "parser", "head", "body"),
    [
        ("asyncio", "C", BAD_GZIP, b""),
        ("uvloop", "C", BAD_GZIP, b""),
        ("asyncio", "Python", BAD_GZIP, b""),
        ("asyncio", "C", BAD_CHUNK, BAD_CHUNK_BODY),
        # The pure-Python parser raised a bare TransferEncodingError quoting the bytes (rt53 R4).
        ("asyncio", "Python", BAD_CHUNK, BAD_CHUNK_BODY),
    ],
)
def test_unreadable_bodies_log_no_tracebacks(
    tmp_path: Path, loop: str, parser: str, head: bytes, body: bytes
) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    env = {"KEYSVC_LOOP": loop, **({"AIOHTTP_NO_EXTENSIONS": "1"} if parser == "Python" else {})}
    with Server(db, env=env) as server:
        for n in range(REQUESTS):
            path = (b"/healthz", b"/v1/verify")[n % 2]
            with connect(server.port, head % path) as sock:
                status, _, _ = read_answer(sock)
                assert status in (200, 401, 405)
                if body:
                    sock.sendall(body)
                # Closed at once, or lingering over the rest: either way, on to the next.
                closed_by_server([sock], 1.0)
        time.sleep(1.0)  # the log is written off the loop's thread
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []
    # Throttled, however many of the drains found the body unreadable.
    told = [line for line in lines if "could not be read" in line["message"]]
    assert len(told) <= 2, told
    assert all("exception" not in line and "Traceback" not in json.dumps(line) for line in told)
