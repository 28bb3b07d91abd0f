"""The servers under test, as subprocesses on free loopback ports.

Each runs in its own session, so a Ctrl-C at the terminal reaches only the
runner, which stops them in order: SIGTERM, then SIGKILL if one has not
exited within ``STOP_SECONDS``. Their stderr goes to a file in the work
folder (keysvc logs a JSON line per request; a pipe nobody reads would block).
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self

from bench.seed import keysvc_env

HOST = "127.0.0.1"
START_SECONDS = 60.0
STOP_SECONDS = 10.0
ROOT = Path(__file__).resolve().parent.parent  # the checkout, so that -m bench.* imports


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the runner's ExitStack: every server is stopped


def stop_servers_on_sigterm() -> None:
    """Make SIGTERM to a runner stop the servers it started (each in its own session,
    so they do not get the signal themselves) before it exits."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class StopsOnExit:
    """A context manager whose exit always calls ``stop``."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Server(StopsOnExit):
    """A started server; a context manager that always stops it."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str]):
        self.name = name
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.log = log
        with log.open("ab") as err:
            self.proc = subprocess.Popen(  # noqa: S603 - commands built here, no shell
                [*command, "--host", HOST, "--port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=env,
                cwd=ROOT,
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                urllib.request.urlopen(self.base + "/", timeout=1)  # noqa: S310 - our loopback URL
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is serving
            except OSError:
                time.sleep(0.05)
            else:
                return
        raise RuntimeError(f"{self.name} did not start within {START_SECONDS:.0f}s; see {self.log}")

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with code {code}; its log ends:\n{tail}")

    def rss_kib(self) -> int:
        """Resident memory now, from /proc/PID/status (VmRSS), in KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _python(name: str, args: list[str], log: Path, env: dict[str, str]) -> Server:
    return Server(name, [sys.executable, *args], log, env)


def start_keysvc(
    db: Path | str, log: Path, settings: dict[str, str] | None = None, name: str = ""
) -> Server:
    """``keysvc serve`` of ``db`` (a file or a PostgreSQL URL): one process, default
    settings (but ``settings``, KEYSVC_* variables), no per-organization key cap or
    write budget to hit (create's rounds write more than an hour's default budget)."""
    env = {
        **keysvc_env(),
        "KEYSVC_MAX_KEYS_PER_ORG": "10000000",
        "KEYSVC_ORG_WRITE_BUDGET_MIB": "0",
        **(settings or {}),
    }
    name = name or f"keysvc ({Path(db).name})"
    return _python(name, ["-m", "keysvc", "serve", "--db", str(db)], log, env)


def start_baseline(shapes: Path, log: Path, loop: str = "asyncio") -> Server:
    args = ["-m", "bench.baseline", "--shapes", str(shapes), "--loop", loop]
    return _python("baseline", args, log, dict(os.environ))
