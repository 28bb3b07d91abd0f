"""A real PostgreSQL server for the tests, from Debian's packages (tests/components.py).

One cluster per test session, so one per pytest-xdist worker: ``initdb`` into a
temporary folder owned by the unprivileged user (``tests.components.unprivileged``:
PostgreSQL refuses to run as root), started by ``pg_ctl`` on a free loopback port
(another, should some other process take it first) with its unix socket in that
folder, and durability off (fsync, synchronous_commit, full_page_writes), as nothing
in it outlives the session. Every test gets a database of its own, copied from the
worker's template that keysvc's own migration (``keysvc.db.postgres.schema``) brought to
the current schema (``CREATE DATABASE ... TEMPLATE``, a file copy), so a test pays
for no schema and sees nothing another left behind.

Administration goes through ``psql`` over the unix socket; the databases each test
makes and drops go through one connection the cluster keeps open
(``AdminConnection``), not a ``psql`` process each.
"""

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from glob import glob
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from keysvc.credentials import PEER_ACKNOWLEDGEMENTS, Hasher
from keysvc.db.postgres.schema import migrate
from tests.components import give_to_unprivileged, require_command, unprivileged
from tests.server import free_port

# The superuser initdb makes; trusted on loopback and the socket, as the cluster is
# the test session's own and reachable by no one else's data.
SUPERUSER = "keysvc"
TEMPLATE = "keysvc_template"
# The pepper every test's instances share (PostgreSQL needs KEYSVC_PEPPER).
PEPPER = bytes(range(32))
# What the instances sign their acknowledgements with, derived from PEPPER as keysvc
# derives it (keysvc.db.backends.open_store): for a store opened by a test itself.
PEER_KEY = Hasher(PEPPER).derive(PEER_ACKNOWLEDGEMENTS)
# Ports tried in turn, should one be taken between its choice and the server's bind.
PORT_ATTEMPTS = 3
# Server settings for throwaway data: no waiting for the disk, and only loopback.
SETTINGS = (
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "listen_addresses=127.0.0.1",
    "max_connections=200",
)
T = TypeVar("T")


def server_bin() -> Path:
    """The folder of PostgreSQL's server commands (initdb, pg_ctl, psql). Debian keeps
    them in /usr/lib/postgresql/<version>/bin, off PATH: the newest version there."""
    versioned = sorted(
        glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(Path(path).parent.name)
    )
    initdb = require_command("initdb", package="postgresql", also=os.pathsep.join(versioned))
    return Path(initdb).resolve().parent


class AdminConnection:
    """One connection to the cluster's ``postgres`` database, on a thread with an event
    loop of its own, so that the synchronous fixtures use it whether or not a test's
    loop is running."""

    def __init__(self, url: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="postgres-admin", daemon=True
        )
        self._thread.start()
        try:
            self._conn: asyncpg.Connection = self._run(asyncpg.connect(url))
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=120)

    def execute(self, sql: str) -> None:
        self._run(self._conn.execute(sql))

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        try:
            self._run(self._conn.close())
        finally:
            self._stop_loop()


class Postgres:
    """A running cluster: ``url`` names a database in it, ``psql`` runs SQL as the
    superuser, ``fresh_database`` copies the template."""

    def __init__(self, root: Path, bindir: Path, port: int):
        self.root = root
        self.bindir = bindir
        self.port = port
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "server.log"
        self._retired: list[str] = []
        self._admin: AdminConnection | None = None

    def command(self, name: str, *args: str) -> list[str]:
        return [*unprivileged(), str(self.bindir / name), *args]

    def run(self, name: str, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            self.command(name, *args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{name} failed: {done.stderr}{self.log_text()}"
        return done.stdout

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> "Postgres":
        for folder in (self.data, self.socket_dir):
            folder.mkdir()
            give_to_unprivileged(folder, 0o700)
        self.log.touch()
        give_to_unprivileged(self.log, 0o600)
        self.run(
            "initdb",
            f"--pgdata={self.data}",
            f"--username={SUPERUSER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        )
        self._serve()
        self.psql("postgres", f"create database {TEMPLATE}")
        # On a thread of its own: the first test to ask for the cluster may be running
        # an event loop already.
        with ThreadPoolExecutor(max_workers=1) as thread:
            thread.submit(asyncio.run, self._migrate(TEMPLATE)).result()
        self._admin = AdminConnection(self.url("postgres"))
        return self

    def _serve(self) -> None:
        """``pg_ctl start`` on the free port chosen; on another one if some other process
        (another xdist worker's server, say) took it in between."""
        for attempt in range(PORT_ATTEMPTS):
            options = [f"-p {self.port}", f"-k {self.socket_dir}"]
            options += [f"-c {setting}" for setting in SETTINGS]
            started = subprocess.run(
                self.command(
                    "pg_ctl",
                    "start",
                    "--wait",
                    "--timeout=60",
                    f"--pgdata={self.data}",
                    f"--log={self.log}",
                    f"--options={' '.join(options)}",
                ),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if started.returncode == 0:
                return
            if "already in use" not in self.log_text() or attempt == PORT_ATTEMPTS - 1:
                raise AssertionError(f"pg_ctl failed: {started.stderr}{self.log_text()}")
            self.port = free_port()

    def restart(self) -> None:
        """Start again, on the same port, a server stopped by ``pg_ctl stop``."""
        self._serve()

    async def _migrate(self, database: str) -> None:
        conn = await asyncpg.connect(self.url(database))
        try:
            await migrate(conn)
        finally:
            await conn.close()

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        subprocess.run(
            self.command("pg_ctl", "stop", "--mode=immediate", f"--pgdata={self.data}"),
            capture_output=True,
            timeout=60,
            check=False,
        )

    def url(self, database: str) -> str:
        """A libpq URL of ``database`` over loopback TCP, as a keysvc instance reaches it."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def psql(self, database: str, sql: str) -> list[Sequence[str]]:
        """Run ``sql`` (one or more statements, in one transaction unless they say
        otherwise) and return the rows of the last, as text."""
        out = self.run(
            "psql",
            f"--host={self.socket_dir}",
            f"--port={self.port}",
            f"--username={SUPERUSER}",
            f"--dbname={database}",
            "--no-psqlrc",
            "--quiet",
            "--tuples-only",
            "--no-align",
            "--field-separator=\t",
            "--set=ON_ERROR_STOP=1",
            stdin=sql,
        )
        return [line.split("\t") for line in out.splitlines() if line]

    def fresh_database(self, template: str = TEMPLATE) -> str:
        """A new database copied from ``template`` (``template0``: an empty one); its name.
        The databases retired since the last call are dropped first."""
        while self._retired:
            self.drop_database(self._retired.pop())
        name = f"test_{uuid.uuid4().hex}"
        # A file copy: with fsync off its checkpoints cost less than logging each page.
        self._administer(f"create database {name} template {template} strategy file_copy")
        return name

    def retire(self, name: str) -> None:
        """Drop ``name`` when the next test asks for a database. Not at once: a test's
        fixtures may be torn down in any order, and an app still closing on it (its
        last usage flush, its webhook leases) must not find it gone."""
        self._retired.append(name)

    def drop_database(self, name: str) -> None:
        self._administer(f"drop database if exists {name} with (force)")

    def _administer(self, sql: str) -> None:
        """One statement on the kept connection (``AdminConnection``)."""
        assert self._admin is not None, "the cluster is not started"
        self._admin.execute(sql)


def start_postgres(parent: Path | None = None) -> Postgres:
    """A new cluster, running, in a new folder of ``parent`` (the temporary folder's by
    default); stop it with ``stop_postgres``."""
    bindir = server_bin()
    # Under pytest-xdist each worker process starts its own (gw0, gw1, ...).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    root = Path(tempfile.mkdtemp(prefix=f"keysvc-postgres-{worker}-", dir=parent))
    give_to_unprivileged(root, 0o700)
    cluster = Postgres(root, bindir, free_port())
    try:
        return cluster.start()
    except BaseException:
        stop_postgres(cluster)
        raise


def stop_postgres(cluster: Postgres) -> None:
    cluster.stop()
    shutil.rmtree(cluster.root, ignore_errors=True)


def start_standby(primary: Postgres, parent: Path | None = None) -> Postgres:
    """A hot standby of ``primary``, made by ``pg_basebackup`` over loopback and fed by
    streaming replication (``--write-recovery-conf``), running on a port of its own;
    stop it with ``stop_postgres``."""
    root = Path(tempfile.mkdtemp(prefix="keysvc-standby-", dir=parent))
    give_to_unprivileged(root, 0o700)
    standby = Postgres(root, primary.bindir, free_port())
    try:
        standby.socket_dir.mkdir()
        give_to_unprivileged(standby.socket_dir, 0o700)
        standby.log.touch()
        give_to_unprivileged(standby.log, 0o600)
        standby.run(
            "pg_basebackup",
            f"--pgdata={standby.data}",
            "--host=127.0.0.1",
            f"--port={primary.port}",
            f"--username={SUPERUSER}",
            "--write-recovery-conf",
            "--wal-method=stream",
            "--checkpoint=fast",
            "--no-sync",
        )
        standby._serve()
    except BaseException:
        stop_postgres(standby)
        raise
    return standby


class Bouncer:
    """A real PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode on a free
    loopback port, in front of one database of ``cluster``: ``url`` names it through
    the pooler. Started by ``start_pgbouncer``; ``stop`` ends it."""

    def __init__(self, root: Path, cluster: Postgres, database: str, port: int):
        self.root = root
        self.port = port
        self.database = database
        self.config = root / "pgbouncer.ini"
        users = root / "users.txt"
        users.write_text(f'"{SUPERUSER}" ""\n')
        self.log = root / "pgbouncer.log"
        self.config.write_text(
            "[databases]\n"
            f"{database} = host=127.0.0.1 port={cluster.port} dbname={database}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            f"unix_socket_dir = {root}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 20\n"
            "max_client_conn = 200\n"
            f"logfile = {self.log}\n"
        )
        for path in (root, self.config, users):
            give_to_unprivileged(path, 0o700 if path == root else 0o600)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    def start(self) -> "Bouncer":
        binary = require_command("pgbouncer", package="pgbouncer")
        self.proc = subprocess.Popen(
            [*unprivileged(), binary, str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not self.log.exists() or "listening on" not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None, f"pgbouncer exited: {self.log_text()}"
            assert time.monotonic() < deadline, f"pgbouncer did not start: {self.log_text()}"
            time.sleep(0.05)
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


def start_pgbouncer(cluster: Postgres, database: str) -> Bouncer:
    """A PgBouncer in transaction pooling mode in front of ``database`` (``Bouncer``)."""
    root = Path(tempfile.mkdtemp(prefix="keysvc-pgbouncer-"))
    return Bouncer(root, cluster, database, free_port()).start()
