"""The tests' ``Server.stderr_text`` reads a running server's log without moving the
offset the server's writes share with it: a seek to the start, with the server
writing in between, made it write over its own first lines, and a test read a line
that began mid-way (test_postgres_nginx failed so in CI, a JSONDecodeError)."""

import json
import threading
import time
import urllib.request
from pathlib import Path

from tests.server import Server, bootstrap

SECONDS = 4.0


def test_lines_read_while_the_server_writes_are_whole(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, env={"KEYSVC_ACCESS_LOG": "all"}) as server:
        until = time.monotonic() + SECONDS

        def requests() -> None:
            while time.monotonic() < until:
                with urllib.request.urlopen(server.base + "/healthz", timeout=10) as answer:
                    answer.read()

        workers = [threading.Thread(target=requests) for _ in range(4)]
        for worker in workers:
            worker.start()
        while time.monotonic() < until:
            server.stderr_text()
        for worker in workers:
            worker.join()
        time.sleep(1)  # the last lines written
        text = server.stderr_text()
    lines = text.splitlines()
    assert len(lines) > 100
    assert all(json.loads(line)["time"] for line in lines)
