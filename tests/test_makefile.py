"""The Makefile: make system-deps as a user who cannot install packages."""

import shutil
import subprocess
from pathlib import Path

from tests.components import shared_directory, unprivileged

ROOT = Path(__file__).resolve().parent.parent


def test_system_deps_as_a_user_who_cannot_install_says_what_to_install_and_goes_on() -> None:
    """Not root, no sudo: make system-deps names the commands missing and the packages
    that bring them, and exits 0 so that make test runs everything else."""
    with shared_directory() as directory:
        shutil.copyfile(ROOT / "Makefile", directory / "Makefile")
        (directory / "Makefile").chmod(0o644)
        deps = "sh:dash keysvc-absent-a:keysvc-pkg-a keysvc-absent-b:keysvc-pkg-b"
        done = subprocess.run(
            [*unprivileged(), "make", "--no-print-directory", "system-deps", f"SYSTEM_DEPS={deps}"],
            capture_output=True,
            text=True,
            cwd=directory,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"},
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == (
        "missing: keysvc-absent-a keysvc-absent-b;"
        " install them with: sudo apt-get install keysvc-pkg-a keysvc-pkg-b"
    ), done.stdout + done.stderr
    assert "apt-get" not in done.stderr


def test_system_deps_names_every_component_the_tests_use() -> None:
    (line,) = [
        line
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("SYSTEM_DEPS ?=")
    ]
    deps = dict(dep.split(":") for dep in line.split("=", 1)[1].split())
    assert deps == {
        "chromium": "chromium",
        "nginx": "nginx",
        "systemd-analyze": "systemd",
        "valgrind": "valgrind",
    }
