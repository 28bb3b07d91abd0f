"""A real keysvc server in a subprocess, on a free loopback port (and a unix socket)."""

import fcntl
import http.client
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
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import Creds, basic

# Ports tried in turn, should one be taken (by a test on another xdist worker, say)
# between its choice and the server's bind.
PORT_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def keysvc(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def bootstrap(db: Path | str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``keysvc bootstrap`` of ``db`` (a file or a PostgreSQL URL): what it printed."""
    done = keysvc("bootstrap", "--db", str(db), *extra, env=env)
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


def call(base: str, path: str, creds: dict[str, str], method: str = "GET",
          body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """A request to a keysvc server with ``creds`` (keyId and keySecret): status and body."""
    data = None if body is None else json.dumps(body).encode()
    headers = {**basic(creds["keyId"], creds["keySecret"]), "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def status_of(url: str, headers: dict[str, str], timeout: float = 30) -> int:
    """The status of a GET of ``url`` with ``headers``, whatever it is."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def integrity(db: Path) -> list[str]:
    """What ``PRAGMA integrity_check`` says of the database file: ["ok"] when sound."""
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("pragma integrity_check")]
    finally:
        conn.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, to a server on the unix socket at ``path``."""

    def __init__(self, path: Path, timeout: float = 10):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.unix_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Server:
    """``keysvc serve`` on a free port; with ``unix``, on that socket too (``--unix``),
    and with ``tcp=False`` on the socket alone."""

    def __init__(
        self,
        db: Path,
        env: dict[str, str] | None = None,
        unix: Path | None = None,
        tcp: bool = True,
        *,
        preexec: Callable[[], None] | None = None,
        args: Sequence[str] = (),
    ):
        """``preexec`` runs in the child before keysvc starts (setting a resource limit, say);
        ``args`` are more flags for ``keysvc serve``."""
        self.unix = unix
        for attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            command = [sys.executable, "-m", "keysvc", "serve", "--db", str(db)]
            command += ["--port", str(self.port)] if tcp else ["--tcp", "off"]
            command += ["--unix", str(unix)] if unix else []
            command += args
            # A file, not a pipe: the server logs a line per request, and a pipe nobody
            # reads fills up and blocks it.
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
            # The server's stderr is this file's open description, offset and all: its
            # writes go to the end whatever this process reads (stderr_text), where a
            # seek here could make the server write over its first lines.
            fd = self._stderr.fileno()
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
            self.proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env={**os.environ, **(env or {})},
                preexec_fn=preexec,
            )
            try:
                self._wait_ready(tcp)
                return
            except BaseException:
                taken = tcp and "already in use" in self.stderr_text()
                self.__exit__()
                if not taken or attempt == PORT_ATTEMPTS - 1:
                    raise

    def _wait_ready(self, tcp: bool) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.stderr_text()}")
            try:
                if tcp:
                    with suppress(urllib.error.HTTPError):  # any HTTP answer means serving
                        urllib.request.urlopen(self.base + "/healthz", timeout=1)
                if self.unix:
                    self.unix_request("GET", "/healthz")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def unix_request(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One request over the unix socket: its status, headers and body."""
        assert self.unix is not None
        connection = UnixHTTPConnection(self.unix, timeout=10)
        try:
            connection.request(method, path, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        finally:
            connection.close()

    def stderr_text(self) -> str:
        """Everything the server has written to stderr so far (JSON log lines)."""
        # Read where it lies, never moving the offset the server's writes share.
        fd = self._stderr.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode()

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
