"""The real system components some tests drive (nginx, Chromium, PostgreSQL,
systemd-analyze, Caddy), and an unprivileged user to run commands as.

They come from Debian's packages: `make system-deps` installs them where it may (root,
or sudo without a password) and otherwise says what to install. A test that needs
one asks ``require_command`` for it: when it is missing, the test is reported as not
run, with the exact command that installs it; under ``CI=true`` it fails instead, so
CI never passes without the real component.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

# Debian puts nginx in /usr/sbin, which is not on every user's PATH; make system-deps
# looks there too.
SBIN = "/usr/sbin:/sbin"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing_reason(command: str, package: str) -> str:
    return f"{command} is missing: install it with `sudo apt-get install {package}`"


def require_command(command: str, package: str, also: str = "") -> str:
    """The path of ``command``; when it is missing, the calling test is skipped with the
    package to install, or fails under CI. ``also``: more folders to look in, as in PATH
    (Debian keeps PostgreSQL's server commands off it)."""
    path = os.pathsep.join(
        part for part in (os.environ.get("PATH", os.defpath), SBIN, also) if part
    )
    found = shutil.which(command, path=path)
    if found:
        return found
    reason = missing_reason(command, package)
    if in_ci():
        pytest.fail(f"{reason} (CI needs every component)", pytrace=False)
    pytest.skip(reason)


def require_file(path: str, package: str) -> str:
    """``path``, a file a package installs that has no command of its own (an nginx
    module); when it is missing, as ``require_command``."""
    if Path(path).is_file():
        return path
    reason = f"{path} is missing: install it with `sudo apt-get install {package}`"
    if in_ci():
        pytest.fail(f"{reason} (CI needs every component)", pytrace=False)
    pytest.skip(reason)


def unprivileged() -> list[str]:
    """A command prefix that runs a command as a user with no privileges: ``nobody``
    when the tests run as root, else the user running them (already unprivileged)."""
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    setpriv = require_command("setpriv", package="util-linux")
    return [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def give_to_unprivileged(path: Path, mode: int) -> None:
    """``path`` owned by the user ``unprivileged`` runs as, with ``mode``."""
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    path.chmod(mode)


@contextmanager
def shared_directory() -> Iterator[Path]:
    """A temporary folder the unprivileged user can read (pytest's tmp_path is private
    to the user running the tests)."""
    with tempfile.TemporaryDirectory(prefix="keysvc-shared-") as name:
        directory = Path(name)
        directory.chmod(0o755)
        yield directory


def start_listening(
    command: list[str],
    out: Path,
    port: int,
    log: Callable[[], str],
    env: dict[str, str] | None = None,
) -> "subprocess.Popen[bytes]":
    """``command`` (a component in the foreground: nginx, Caddy) in a process group of
    its own, its output to ``out``; returned once it accepts connections on
    127.0.0.1:``port``. If it exits first, or does not listen within 30 s, it fails
    with ``log()``."""
    name = Path(command[0]).name
    with out.open("wb") as written:
        proc = subprocess.Popen(
            command, stdout=written, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log()}")
        with socket.socket() as sock, suppress(OSError):
            sock.connect(("127.0.0.1", port))
            return proc
        time.sleep(0.05)
    stop_group(proc)
    raise RuntimeError(f"{name} did not start: {log()}")


def stop_group(proc: "subprocess.Popen[bytes] | None") -> None:
    """SIGTERM to a process ``start_listening`` started, 10 s for it to end, then
    whatever is left of its process group (its own: only its workers) is killed."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
