"""A real keysvc server in a subprocess, on a free loopback port."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import Creds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def keysvc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def bootstrap(db: Path, *extra: str) -> dict[str, Any]:
    done = keysvc("bootstrap", "--db", str(db), *extra)
    assert done.returncode == 0, done.stderr
    created: dict[str, Any] = json.loads(done.stdout)
    return created


def admin_creds(created: dict[str, Any]) -> Creds:
    """The admin key ``bootstrap`` printed, as Creds."""
    return Creds(created["organizationId"], created["id"], created["keyId"], created["keySecret"])


async def listed_keys(
    session: aiohttp.ClientSession, base: str, admin: Creds
) -> tuple[dict[str, str], int]:
    """Every key of ``admin``'s organization, UUID to name, through the list's pages,
    and the totalCount the last page reported."""
    url = f"{base}/v1/organizations/{admin.organization_id}/keys"
    found: dict[str, str] = {}
    params = {"limit": "250"}
    while True:
        async with session.get(url, params=params, headers=admin.headers) as response:
            body = await response.json()
        assert response.status == 200, body
        found.update((key["id"], key["name"]) for key in body["result"])
        if not body.get("nextCursor"):
            return found, body["totalCount"]
        params = {"limit": "250", "cursor": body["nextCursor"]}


def integrity(db: Path) -> list[str]:
    """What ``PRAGMA integrity_check`` says of the database file: ["ok"] when sound."""
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("pragma integrity_check")]
    finally:
        conn.close()


class Server:
    def __init__(
        self,
        db: Path,
        env: dict[str, str] | None = None,
        *,
        preexec: Callable[[], None] | None = None,
    ):
        """``preexec`` runs in the child before keysvc starts (setting a resource limit, say)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # A file, not a pipe: the server logs a line per request, and a pipe nobody
        # reads fills up and blocks it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "keysvc", "serve", "--db", str(db), "--port", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.stderr_text()}")
            try:
                urllib.request.urlopen(self.base + "/", timeout=1)
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is serving
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def stderr_text(self) -> str:
        """Everything the server has written to stderr so far (JSON log lines)."""
        self._stderr.seek(0)
        return self._stderr.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> float:
        """Send ``sig``; returns how long the process took to exit."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout)
        return time.monotonic() - started

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self._stderr):
            if stream:
                stream.close()
