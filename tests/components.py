"""The real system components some tests drive (nginx, Chromium, valgrind, systemd-analyze).

They come from Debian's packages: `make system-deps` installs them where it may (root,
or sudo without a password) and otherwise says what to install. A test that needs
one asks ``require_command`` for it: when it is missing, the test is reported as not
run, with the exact command that installs it; under ``CI=true`` it fails instead, so
CI never passes without the real component.
"""

import os
import shutil

import pytest

# Debian puts nginx in /usr/sbin, which is not on every user's PATH; make system-deps
# looks there too.
SBIN = "/usr/sbin:/sbin"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing_reason(command: str, package: str) -> str:
    return f"{command} is missing: install it with `sudo apt-get install {package}`"


def require_command(command: str, package: str) -> str:
    """The path of ``command``; when it is missing, the calling test is skipped with the
    package to install, or fails under CI."""
    path = os.environ.get("PATH", os.defpath)
    found = shutil.which(command, path=f"{path}{os.pathsep}{SBIN}")
    if found:
        return found
    reason = missing_reason(command, package)
    if in_ci():
        pytest.fail(f"{reason} (CI needs every component)", pytrace=False)
    pytest.skip(reason)
