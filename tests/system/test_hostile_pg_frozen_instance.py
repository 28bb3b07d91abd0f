"""An instance that was frozen (SIGSTOP; a paused VM or container does the same) while
another instance disabled a key whose announcement was lost (the writer's connection
cut right after its COMMIT's reply, tests/pgfaults.py's ``CommitCutter``). The writer
answers after ACKNOWLEDGE_SECONDS, by when, the docs say, every other instance has read
the generation by polling or turned its caches off. The frozen one did neither: its
probe did not run. Woken, its first answer must not come from what it cached before."""

import os
import signal
import socket
import time

from keysvc.config import Settings
from keysvc.db.postgres.notifications import ACKNOWLEDGE_SECONDS
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, assert_ok, basic, bootstrap, create_creds, keys_url
from tests.pgfaults import CommitCutter, announce_cutter
from tests.postgres import PEPPER, SUPERUSER, Postgres
from tests.server import Server

UPDATE_KEY = b"update api_keys set "
ENV = {"KEYSVC_PEPPER": PEPPER.hex()}


cutter = announce_cutter()


def _ask(conn: socket.socket, headers: dict[str, str]) -> None:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    conn.sendall(f"GET /v1/whoami HTTP/1.1\r\nHost: keysvc\r\n{lines}\r\n".encode())


def _status(conn: socket.socket) -> int:
    """The status of the next answer on a kept-alive connection (its body read too)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return int(head.split(b" ", 2)[1])


async def test_an_instance_woken_after_the_bound_does_not_answer_from_its_cache(
    postgres: Postgres, pg_database: str, cutter: CommitCutter, aiohttp_client: ClientFactory
) -> None:
    port = await cutter.start()
    relayed = f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{pg_database}"
    # The pepper as the server below reads it from KEYSVC_PEPPER.
    settings = Settings(db_url=relayed, pepper=PEPPER.hex().encode())
    a = await aiohttp_client(create_app(settings))
    admin = await bootstrap(a.app)
    key = await create_creds(a, admin, {"name": "k", "roles": ["developer"]})
    headers = basic(key.key_id, key.secret)
    with Server(postgres.url(pg_database), env=ENV) as b:  # type: ignore[arg-type]
        conn = socket.create_connection(("127.0.0.1", b.port), timeout=30)
        _ask(conn, headers)
        assert _status(conn) == 200  # b has it cached now
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            cutter.marker = UPDATE_KEY
            started = time.monotonic()
            response = await a.patch(
                keys_url(admin, key.id), json={"state": "disabled"}, headers=admin.headers
            )
            assert (await assert_ok(response))["state"] == "disabled"
            assert cutter.cuts == 1
            assert time.monotonic() - started >= ACKNOWLEDGE_SECONDS - 0.1
            _ask(conn, headers)  # waits in b's socket while b is stopped
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        assert _status(conn) == 401
        conn.close()
