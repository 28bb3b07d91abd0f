"""A body keysvc's view left unread that cannot be read as it is drained (it claims a
Content-Encoding it is not in) is the client's doing, as often as it likes: keysvc logs it
at most once an interval, with no traceback. aiohttp logged an error-level traceback for
each, on any route that reads no body, with no key needed (rt52 F3)."""

import json
from pathlib import Path

import pytest

from tests.server import Server, bootstrap
from tests.system.rawconn import closed_by_server, connect, read_answer

BAD_GZIP = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"
REQUESTS = 20


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_unreadable_bodies_log_no_tracebacks(tmp_path: Path, loop: str) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, env={"KEYSVC_LOOP": loop}) as server:
        for n in range(REQUESTS):
            path = (b"/healthz", b"/v1/verify")[n % 2]
            with connect(server.port, BAD_GZIP % path) as sock:
                status, _, _ = read_answer(sock)
                assert status in (401, 405)
                closed_by_server([sock], 5.0)
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    assert [line for line in lines if line["level"] in ("error", "critical")] == []
    told = [line for line in lines if "could not be read" in line["message"]]
    assert 1 <= len(told) <= 2, told
    assert all("exception" not in line and "Traceback" not in json.dumps(line) for line in told)
