"""Real faults of a PostgreSQL server for the tests of keysvc's answers to them
(tests/system/test_postgres_frozen.py, test_postgres_refused.py,
test_postgres_lost_commit.py, test_postgres_lost_announce.py): a cluster of a
module's own (``own_cluster``), frozen by SIGSTOP (``frozen``), and a loopback TCP
relay between keysvc and the server that cuts a connection between a COMMIT and its
reply, or right after the reply (``CommitCutter``)."""

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse

from tests.helpers import Client
from tests.postgres import Postgres, start_postgres, stop_postgres

# A COMMIT as asyncpg sends it: a simple query ('Q', its length, the text, a NUL).
COMMIT = b"Q\x00\x00\x00\x0cCOMMIT;\x00"
BEGIN = b"BEGIN"
# How long the relay waits, once it has forwarded a COMMIT, before cutting: the
# server has read it and commits; its reply is never forwarded.
CUT_AFTER_SECONDS = 0.3


@contextmanager
def own_cluster(parent: Path | None = None) -> Iterator[Postgres]:
    """A cluster for one module (``parent``: the folder it lives in), removed after."""
    cluster = start_postgres(parent)
    try:
        yield cluster
    finally:
        stop_postgres(cluster)


def module_cluster(parent: Path | None = None) -> Callable[[], Iterator[Postgres]]:
    """A ``postgres`` fixture for a module whose tests harm their cluster (freeze it,
    change its pg_hba.conf, fill its NOTIFY queue): one of the module's own, in
    ``parent``, so that no other test's database shares its fate.
    A test module takes it by name: ``postgres = pgfaults.module_cluster()``."""

    @pytest.fixture(scope="module")
    def postgres() -> Iterator[Postgres]:
        with own_cluster(parent) as cluster:
            yield cluster

    return postgres


def server_processes(cluster: Postgres) -> list[int]:
    """The postmaster and every process it started (its backends included)."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            stat = (entry / "stat").read_text()
            # The fourth field, after the command in parentheses, is the parent's pid.
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry.name))
    return [postmaster, *children]


@contextmanager
def frozen(cluster: Postgres) -> Iterator[None]:
    """The whole server stopped (SIGSTOP) until the block ends (SIGCONT): a server
    that answers nothing and resets nothing, as behind a partition."""
    stopped = server_processes(cluster)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def timed(
    client: Client,
    method: str,
    path: str,
    body: Any = None,
    headers: Any = None,
    give_up: float = 30.0,
) -> tuple[ClientResponse, float]:
    """One request and how long its answer took; given up (TimeoutError) after ``give_up``
    seconds: without keysvc's bounds a frozen server holds it for the TCP stack's
    timeout (about 15 minutes)."""
    started = time.monotonic()
    async with asyncio.timeout(give_up):
        response = await client.request(method, path, json=body, headers=headers)
        await response.read()
    return response, time.monotonic() - started


class CommitCutter:
    """A loopback TCP relay to PostgreSQL. Armed with a marker, it forwards everything,
    and the first COMMIT of a transaction whose statements hold the marker is
    forwarded, then both sides of that connection are cut before any reply: the
    transaction is committed, and its client cannot know."""

    def __init__(self, target_port: int):
        self._target = target_port
        self._server: asyncio.Server | None = None
        self.marker: bytes | None = None
        # Cut after the COMMIT's reply is forwarded instead: committed and acknowledged,
        # and nothing sent after it reaches the server (keysvc's announcement).
        self.after_reply = False
        self.cuts = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self._target)
        writers = (client_w, server_w)
        back = asyncio.create_task(self._pipe(server_r, client_w))
        self._tasks.add(back)
        try:
            await self._forward(client_r, server_w, back)
        finally:
            back.cancel()
            for writer in writers:
                writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Server to client, until the server closes; then the client's side too."""
        with suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    async def _forward(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, back: asyncio.Task[None]
    ) -> None:
        """Client to server; returns (and the connection is cut) after a marked COMMIT,
        whose reply is never forwarded (``back``, the other way, stopped first)."""
        pending = b""  # what was sent since the last COMMIT
        with suppress(OSError):
            while data := await reader.read(65536):
                pending += data
                at = pending.find(COMMIT)
                if at < 0:
                    writer.write(data)
                    await writer.drain()
                    continue
                transaction = pending[pending.rfind(BEGIN, 0, at) : at]
                if self.marker is not None and self.marker in transaction:
                    self.marker = None
                    self.cuts += 1
                    if not self.after_reply:
                        back.cancel()
                    # Everything up to the COMMIT's end, and nothing after it.
                    end = at + len(COMMIT)
                    writer.write(data[: len(data) - (len(pending) - end)])
                    await writer.drain()
                    await asyncio.sleep(CUT_AFTER_SECONDS)
                    return
                writer.write(data)
                await writer.drain()
                pending = pending[at + len(COMMIT) :]


def login_role() -> Callable[[Postgres], Iterator[str]]:
    """A ``mallory`` fixture for a module: a LOGIN role with no grant at all (CONNECT on
    keysvc's database is PUBLIC's), dropped after the test with what it owns there.
    A test module takes it by name: ``mallory = pgfaults.login_role()``."""

    @pytest.fixture
    def mallory(postgres: Postgres) -> Iterator[str]:
        name = f"mallory_{uuid.uuid4().hex[:12]}"
        postgres.psql("postgres", f"create role {name} login")
        yield name
        postgres.psql(
            "postgres",
            f"select pg_terminate_backend(pid) from pg_stat_activity where usename = '{name}'",
        )
        postgres.psql("postgres", f"drop owned by {name}; drop role {name}")

    return mallory


def announce_cutter() -> Callable[[Postgres], AsyncIterator[CommitCutter]]:
    """A ``cutter`` fixture for a module: a relay that cuts a connection right after its
    COMMIT's reply (committed and acknowledged; keysvc's announcement after it never
    reaches the server). A test module takes it as ``cutter = pgfaults.announce_cutter()``."""

    @pytest.fixture
    async def cutter(postgres: Postgres) -> AsyncIterator[CommitCutter]:
        relay = CommitCutter(postgres.port)
        relay.after_reply = True
        yield relay
        await relay.close()

    return cutter
