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
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
