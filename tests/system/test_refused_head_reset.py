"""A client that resets its connection right after a head keysvc refuses gets its 400
or nothing, and keysvc logs nothing of it: on asyncio's loop, the half-close after the
answer (``_HalfClosing.close``) met a connection already reset and raised out of the
connection's task, which asyncio logged as an error with a traceback, as often as a
client liked (rt49 F6: 300 such lines in 15 s). uvloop never raised it."""

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from tests.server import Server, bootstrap
from tests.system.rawconn import connect

# A head aiohttp's parser refuses (a control character in a header name): a 400, then
# keysvc lingers over what the client still sends.
BAD = b"GET / HTTP/1.1\r\nHost: x\r\nBad\x01: y\r\n\r\n"
SECONDS = 6.0


def _reset_after_bad_heads(port: int, source: str, until: float) -> None:
    pauses = (0.0, 0.0005, 0.001, 0.002, 0.005)
    tails = (b"", b"z" * 100, b"z" * 5000)
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            sock = connect(port, BAD + tails[n % len(tails)], source)
            time.sleep(pauses[n % len(pauses)])
            # SO_LINGER 0: close sends a reset, not a FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        except OSError:
            pass


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_resets_after_refused_heads_log_no_error(tmp_path: Path, loop: str) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, env={"KEYSVC_LOOP": loop}) as server:
        until = time.monotonic() + SECONDS
        threads = [
            threading.Thread(
                target=_reset_after_bad_heads, args=(server.port, f"127.0.0.{n}", until)
            )
            for n in (1, 2, 3, 4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(3)  # the lingers end
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    errors = [line for line in lines if line["level"] in ("error", "critical")]
    assert errors == [], errors[:2]
    assert "Traceback" not in json.dumps(lines)
