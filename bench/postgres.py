"""A throwaway PostgreSQL cluster for the benchmark's third app (C, keysvc on PostgreSQL).

``initdb`` into a temporary folder, then ``pg_ctl`` on a free loopback port with its
unix socket in that folder; as ``nobody`` when the runner is root (PostgreSQL refuses
to run as root). Durability stays at PostgreSQL's defaults (fsync, synchronous_commit
and full_page_writes on), as SQLite's synchronous=FULL is for B: C/B compares two
backends that both keep what they acknowledge. Stopping it removes the folder.

tests/postgres.py starts a cluster the same way for the tests; it is not imported
here, as the bench must run without the test extras (pytest) and the tests' cluster
turns durability off. The few lines both need are written in each.
"""

import os
import pwd
import shutil
import subprocess
import tempfile
from glob import glob
from pathlib import Path

from bench.servers import StopsOnExit, free_port

SUPERUSER = "keysvc"
DATABASE = "keysvc"
# What keysvc serve on PostgreSQL needs (KEYSVC_PEPPER): throwaway benchmark data.
PEPPER = "bench-pepper-" + "0" * 51
COMMAND_SECONDS = 120


def server_bin() -> Path | None:
    """The folder of PostgreSQL's server commands (Debian keeps them off PATH in
    /usr/lib/postgresql/<version>/bin: the newest there), or None if not installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versioned = sorted(
        glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda path: int(Path(path).parts[-3])
    )
    return Path(versioned[-1]).parent if versioned else None


def _unprivileged() -> list[str]:
    """A command prefix that runs as ``nobody`` when the runner is root; else nothing."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("bench: setpriv (util-linux) is needed to run PostgreSQL as nobody")
    nobody = pwd.getpwnam("nobody")
    return [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def _give_to_unprivileged(path: Path) -> None:
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    path.chmod(0o700)


class Cluster(StopsOnExit):
    """A running cluster with one empty database, ``DATABASE``; a context manager that
    stops it and removes its folder."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="keysvc-bench-postgres-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.log = self.root / "server.log"
        self.port = free_port()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _run(self, name: str, *args: str) -> str:
        done = subprocess.run(  # noqa: S603 - PostgreSQL's own commands, no shell
            [*_unprivileged(), str(self.bindir / name), *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"bench: {name} failed: {done.stderr.strip()}\n{log}")
        return done.stdout

    def _start(self) -> None:
        _give_to_unprivileged(self.root)
        for folder in (self.data, self.socket_dir):
            folder.mkdir()
            _give_to_unprivileged(folder)
        self.log.touch()
        _give_to_unprivileged(self.log)
        self._run(
            "initdb",
            f"--pgdata={self.data}",
            f"--username={SUPERUSER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
        )
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl",
            "start",
            "--wait",
            "--timeout=60",
            f"--pgdata={self.data}",
            f"--log={self.log}",
            f"--options={options}",
        )
        self._run(
            "psql",
            f"--host={self.socket_dir}",
            f"--port={self.port}",
            f"--username={SUPERUSER}",
            "--dbname=postgres",
            "--no-psqlrc",
            "--quiet",
            f"--command=create database {DATABASE}",
        )

    def run(self, name: str, *args: str) -> str:
        """One of PostgreSQL's commands (``pg_basebackup``, ``pg_ctl``...) as the
        cluster's user; its output."""
        return self._run(name, *args)

    @property
    def url(self) -> str:
        """``DATABASE`` over loopback TCP, as keysvc reaches it."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def version(self) -> str:
        return self._run("postgres", "--version").strip()

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            pg_ctl = [str(self.bindir / "pg_ctl"), "stop", "--mode=fast", f"--pgdata={self.data}"]
            subprocess.run(  # noqa: S603 - PostgreSQL's own command, no shell
                [*_unprivileged(), *pg_ctl],
                capture_output=True,
                timeout=COMMAND_SECONDS,
                check=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)
