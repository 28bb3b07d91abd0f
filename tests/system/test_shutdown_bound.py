"""``keysvc serve`` stops within one bound after SIGTERM, whatever its clients do: a
client that has stopped reading its answers holds a handler in the middle of a write,
and that handler gets what is left of the one shutdown deadline, not a second wait of
its own (rt45 R2-2: 5 s for the requests in flight, then 5 s more in aiohttp's cleanup).
"""

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from keysvc.cli.serve import SHUTDOWN_SECONDS
from tests.server import Server, bootstrap, integrity
from tests.system.rawconn import PIPELINED, send_queue

# What the stop may take past the deadline: the database's close and the process's exit.
MARGIN = 2.5


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_sigterm_with_a_client_that_stopped_reading_stops_within_the_bound(
    tmp_path: Path, loop: str
) -> None:
    """The client pipelines requests and reads none of their answers, until keysvc's
    send queue for it is full and its writes wait on the client; then SIGTERM. The
    header timeout is long, so that only the shutdown ends that connection."""
    db = tmp_path / "k.db"
    bootstrap(db)
    env = {"KEYSVC_LOOP": loop, "KEYSVC_HEADER_TIMEOUT": "60", "KEYSVC_IDLE_TIMEOUT": "600"}
    with Server(db, env=env) as server, socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        client.connect(("127.0.0.1", server.port))
        client.settimeout(20)

        def pipeline() -> None:
            with contextlib.suppress(OSError):
                client.sendall(PIPELINED * 30_000)

        threading.Thread(target=pipeline, daemon=True).start()
        port = client.getsockname()[1]
        # Full: not empty, and no longer growing (the client acknowledges nothing).
        queued = [0]
        deadline = time.monotonic() + 20
        while not 0 < queued[-1] == queued[-3:][0]:
            assert time.monotonic() < deadline, f"keysvc's send queue never filled: {queued}"
            time.sleep(0.2)
            queued.append(send_queue(server.port, port))
        took = server.stop(timeout=SHUTDOWN_SECONDS + 15)
        log = [json.loads(line) for line in server.stderr_text().splitlines()]
    assert server.proc.returncode == 0
    assert took < SHUTDOWN_SECONDS + MARGIN, took
    assert log[-1]["message"] == "stopped"
    troubles = [line for line in log if line["level"] in ("error", "critical")]
    assert troubles + [line for line in log if "exception" in line] == []
    assert "Traceback" not in json.dumps(log)
    # The database was closed: the WAL was checkpointed and removed on close.
    assert not Path(f"{db}-wal").exists()
    assert integrity(db) == ["ok"]
