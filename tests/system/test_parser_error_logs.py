"""What a real ``keysvc serve`` logs about requests aiohttp's parser refuses: one
short line each, never a byte of the request (credentials split across TCP
segments or folded onto a second line included), and a flood of them costs a
few lines, not a traceback each."""

import base64
import json
import socket
import time
from pathlib import Path

import pytest

from keysvc.http.middleware import PARSER_ERROR_LINES, PARSER_ERROR_SECONDS
from tests.server import Server, bootstrap


@pytest.fixture(autouse=True)
def _database(tmp_path: Path) -> None:
    """The database each test's server serves, made as `keysvc bootstrap` makes it."""
    bootstrap(tmp_path / "k.db")


WITHIN = 30.0
# Not a keysvc secret: nothing but its place in the request could tell a scrubber
# that it is a credential.
TOKEN = base64.b64encode(b"partner-id:partner-secret-0123456789").decode()
SEGMENTED = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Basic ",
    TOKEN.encode() + b"\x01\r\n\r\n",
]
OBS_FOLD = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Basic\r\n " + TOKEN.encode() + b"\r\n\r\n"
]


def send(port: int, segments: list[bytes]) -> dict[str, object]:
    """Send each segment in a TCP segment of its own; the answer's JSON body."""
    with socket.create_connection(("127.0.0.1", port), timeout=WITHIN) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for number, segment in enumerate(segments):
            if number:
                time.sleep(0.2)  # so that the server reads the segments apart
            sock.sendall(segment)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 "), answer
    parsed: dict[str, object] = json.loads(body)
    return parsed


def log_lines(server: Server) -> list[dict[str, object]]:
    return [json.loads(line) for line in server.stderr_text().splitlines()]


def parser_lines(server: Server) -> list[dict[str, object]]:
    return [line for line in log_lines(server) if "unparseable" in str(line["message"])]


def test_a_credential_in_a_refused_request_is_never_logged(tmp_path: Path) -> None:
    with Server(tmp_path / "k.db") as server:
        answers = [send(server.port, segments) for segments in (SEGMENTED, OBS_FOLD)]
        server.stop()  # the log written out
        text = server.stderr_text()
        lines = parser_lines(server)
    assert TOKEN not in text and "partner-secret" not in text
    assert [line["requestId"] for line in lines] == [answer["requestId"] for answer in answers]
    for line in lines:
        assert line["level"] == "warning" and line["remote"] == "127.0.0.1"
        assert str(line["message"]).startswith("unparseable request answered 400: ")
        assert "exception" not in line


def test_a_flood_of_junk_headers_costs_a_few_lines(tmp_path: Path) -> None:
    """200 requests of 16 KB junk each: a few lines, then one per interval that counts
    the rest, and every request accounted for."""
    sent = 200
    junk = b"X-Junk: " + b"j\x01" * 8000 + b"\r\n"
    request = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + junk + b"\r\n"]
    with Server(tmp_path / "k.db") as server:
        for _ in range(sent):
            send(server.port, request)
        deadline = time.monotonic() + PARSER_ERROR_SECONDS + WITHIN
        while True:
            assert "Traceback" not in server.stderr_text()
            lines = parser_lines(server)
            written = [line for line in lines if "leftOut" not in line]
            left_out = sum(int(str(line.get("leftOut", 0))) for line in lines)
            if len(written) + left_out >= sent:
                break
            assert time.monotonic() < deadline, (len(written), left_out)
            time.sleep(0.2)
        text = server.stderr_text()
    assert len(written) + left_out == sent
    windows = len(lines) - len(written)  # one summary line per interval
    assert len(written) <= windows * PARSER_ERROR_LINES
    assert "Traceback" not in text and "jj" not in text
    # Short lines: the whole log, access lines aside, is a small fraction of the junk.
    not_access = [line for line in text.splitlines() if '"keysvc.access"' not in line]
    assert max(map(len, not_access)) < 300
    assert len("\n".join(not_access)) < sent * len(request[0]) // 200
