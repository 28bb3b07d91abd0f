"""Usage counts on a real `keysvc serve --workers 2`: requests spread over the workers
add up to exactly their number, written by each worker's flush, and by a clean stop."""

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import basic
from tests.server import Server, bootstrap, call, status_of

REQUESTS = 60


def _new_key(server: Server, created: dict[str, Any]) -> dict[str, Any]:
    path = f"/v1/organizations/{created['organizationId']}/keys"
    status, body = call(server.base, path, created, "POST", {"name": "t", "roles": ["developer"]})
    assert status == 200, body
    result: dict[str, Any] = body["result"]
    return result


def _verify(server: Server, key: dict[str, Any], count: int) -> None:
    """``count`` verifies, each on a new connection: the kernel spreads those over the
    workers' listening sockets."""
    headers = basic(key["keyId"], key["keySecret"])
    for _ in range(count):
        assert status_of(server.base + "/v1/verify", headers) == 200


def _successes(server: Server, created: dict[str, Any], key_id: str) -> int:
    path = f"/v1/organizations/{created['organizationId']}/keys/{key_id}/usage?granularity=day"
    status, body = call(server.base, path, created)
    assert status == 200, body
    return sum(bucket["success"] for bucket in body["result"]["series"])


@contextmanager
def _verified(tmp_path: Path, flush_seconds: str) -> Iterator[tuple[Server, dict[str, Any], str]]:
    """Two workers that flush every ``flush_seconds``, once REQUESTS verifies of a new key
    are answered: the server, the bootstrap admin and the key's UUID. Stopped cleanly
    (SIGTERM) on the way out."""
    db = tmp_path / "k.db"
    created = bootstrap(db)
    env = {"KEYSVC_USAGE_FLUSH_SECONDS": flush_seconds}
    with Server(db, env=env, args=["--workers", "2"]) as server:
        key = _new_key(server, created)
        _verify(server, key, REQUESTS)
        yield server, created, key["key"]["id"]
        server.stop()
        assert server.proc.returncode == 0


def test_workers_counts_add_up_through_their_flushes(tmp_path: Path) -> None:
    with _verified(tmp_path, "0.2") as (server, created, key_id):
        deadline = time.monotonic() + 30
        seen = _successes(server, created, key_id)
        while seen < REQUESTS and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = _successes(server, created, key_id)
        assert seen == REQUESTS
        # Flushed once, never twice: the sum stays.
        time.sleep(1)
        assert _successes(server, created, key_id) == REQUESTS


def test_a_clean_stop_writes_every_count(tmp_path: Path) -> None:
    """With a flush interval longer than the test, only the stop (SIGTERM) writes."""
    with _verified(tmp_path, "3600") as (_, _, key_id):
        pass
    conn = sqlite3.connect(tmp_path / "k.db")
    try:
        counted = "select sum(success) from key_usage where key_id = ?"
        (written,) = conn.execute(counted, (key_id,)).fetchone()
    finally:
        conn.close()
    assert written == REQUESTS
