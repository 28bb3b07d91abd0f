"""A rotation's grace period on a real ``keysvc serve --workers 2``: the previous
credentials work on every worker until the grace ends, and from at most one second
after it each worker refuses them as it refuses an unknown key; the new ones work
throughout. Each request is sent on a kept-alive connection whose worker is known
(from /proc), so both workers are seen to answer, with what each has cached."""

import http.client
import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keysvc.credentials import new_key_id, new_secret
from keysvc.timeutil import from_text
from tests.helpers import ROTATED, UNAUTHORIZED, basic
from tests.server import Server, bootstrap, call

GRACE_SECONDS = 6
# How late after the grace end a worker may still accept the previous credentials.
LATE = 1.0


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _accepted_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the server's end of the loopback connection from ``client_port``."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, remote = fields[1], fields[2]
            if local.endswith(f":{server_port:04X}") and remote.endswith(f":{client_port:04X}"):
                return fields[9]
    return None


@dataclass
class Connection:
    """A kept-alive connection to one worker."""

    conn: http.client.HTTPConnection
    worker: int

    def whoami(self, creds: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.conn.request("GET", "/v1/whoami", headers=basic(creds["keyId"], creds["keySecret"]))
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())


def _one_per_worker(server: Server, creds: dict[str, str]) -> dict[int, Connection]:
    """A connection to each of the server's workers: new connections are opened, and
    the kernel spreads them, until each worker holds one."""
    workers = _children(server.proc.pid)
    assert len(workers) == 2, workers
    found: dict[int, Connection] = {}
    spare: list[http.client.HTTPConnection] = []
    deadline = time.monotonic() + 60
    try:
        while len(found) < len(workers) and time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            spare.append(conn)
            assert Connection(conn, 0).whoami(creds)[0] == 200  # so it has been accepted
            inode = _accepted_inode(server.port, conn.sock.getsockname()[1])
            owner = next((pid for pid in workers if inode in _socket_inodes(pid)), None)
            if owner is not None and owner not in found:
                found[owner] = Connection(spare.pop(), owner)
    finally:
        for conn in spare:
            conn.close()
    if len(found) < len(workers):
        for connection in found.values():
            connection.conn.close()
        raise AssertionError(f"connections reached workers {sorted(found)} only")
    return found


@dataclass(frozen=True)
class Seen:
    worker: int
    which: str  # "previous" or "new"
    sent: float
    answered: float
    status: int
    body: dict[str, Any]


def test_the_grace_ends_on_every_worker_within_a_second(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    admin = bootstrap(db)
    org = admin["organizationId"]
    # Many refusals come from this one address: keep the failed-login limit out of it.
    env = {"KEYSVC_WORKERS": "2", "KEYSVC_AUTH_FAILURES": "100000"}
    with Server(db, env=env) as server, ExitStack() as closing:
        status, made = call(server.base, f"/v1/organizations/{org}/keys", admin, "POST",
                            {"name": "svc", "roles": ["developer"]})  # fmt: skip
        assert status == 200, made
        old = made["result"]
        workers = _one_per_worker(server, old)
        for connection in workers.values():
            closing.callback(connection.conn.close)
        for connection in workers.values():  # each worker has the key cached
            assert connection.whoami(old)[0] == 200
        url = f"/v1/organizations/{org}/keys/{old['key']['id']}/rotate"
        status, rotated = call(
            server.base, url, admin, "POST", {"gracePeriodSeconds": GRACE_SECONDS}
        )
        assert status == 200, rotated
        new = rotated["result"]
        end = from_text(rotated["result"]["key"]["previousCredentialExpiresAt"]).timestamp()
        seen: list[Seen] = []

        def late_on_each() -> bool:
            """Whether every worker was asked with the previous credentials after LATE."""
            late = {s.worker for s in seen if s.which == "previous" and s.sent >= end + LATE}
            return late == set(workers)

        # Until a second past LATE, and on until each worker was asked after it, however
        # slow the machine; the deadline only keeps a hung server from hanging the test.
        deadline = end + 60
        while (time.time() < end + LATE + 1.0 or not late_on_each()) and time.time() < deadline:
            for connection in workers.values():
                for which, creds in (("previous", old), ("new", new)):
                    sent = time.time()
                    status, body = connection.whoami(creds)
                    seen.append(Seen(connection.worker, which, sent, time.time(), status, body))
            time.sleep(0.05)
        unknown = {"keyId": new_key_id(), "keySecret": new_secret()}
        unknown_answers = {
            worker: connection.whoami(unknown) for worker, connection in workers.items()
        }
        server.stop()

    assert all(s.status == 200 for s in seen if s.which == "new"), "the new credentials failed"
    previous = [s for s in seen if s.which == "previous"]
    before = [s for s in previous if s.answered < end]
    after = [s for s in previous if s.sent >= end + LATE]
    assert all(s.status == 200 for s in before), [s for s in before if s.status != 200]
    # The old pair, its grace over, gets its own 401 on every worker; an unknown key
    # ID still gets the usual one.
    for s in after:
        assert s.status == 401, s
        assert {k: v for k, v in s.body.items() if k != "requestId"} == {
            "status": 401,
            "error": ROTATED,
        }
    for status, body in unknown_answers.values():
        assert status == 401 and body["error"] == UNAUTHORIZED, body
    for worker in workers:
        assert any(s.worker == worker for s in before), f"worker {worker}: nothing before the end"
        assert any(s.worker == worker for s in after), f"worker {worker}: nothing after the end"
