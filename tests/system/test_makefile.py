"""The Makefile: where make run serves, what run and test install, and make system-deps
as a user who cannot install packages.

Recipes are read with ``make -n`` where running them would install or serve; make run
also runs for real once, on a free port and a temporary database.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.components import shared_directory, unprivileged
from tests.helpers import basic
from tests.server import free_port

ROOT = Path(__file__).resolve().parents[2]
MAKE = ["make", "--no-print-directory", "-C", str(ROOT)]
# Never reinstall the environment running these tests.
INSTALLED = ["-o", ".venv/.installed-stamp", "-o", ".venv/.installed-test-stamp"]
SETTINGS = ("KEYSVC_DB", "KEYSVC_HOST", "KEYSVC_PORT", "DB", "HOST", "PORT")


def dry_run(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """The recipe lines ``make -n`` prints, with the environment's settings replaced by
    ``env``."""
    clean = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    done = subprocess.run(
        [*MAKE, "-n", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def serve_line(lines: list[str]) -> str:
    (line,) = [line for line in lines if " serve " in line]
    return line


def test_make_run_serves_where_the_defaults_say() -> None:
    line = serve_line(dry_run(*INSTALLED, "run"))
    assert line.endswith("serve --db var/keysvc.db --host 127.0.0.1 --port 8080")


def test_make_run_takes_keysvc_settings_from_the_environment() -> None:
    env = {"KEYSVC_PORT": "9090", "KEYSVC_HOST": "127.0.0.3", "KEYSVC_DB": "/srv/k/k.db"}
    lines = dry_run(*INSTALLED, "run", env=env)
    assert "mkdir -p /srv/k/" in lines
    assert serve_line(lines).endswith("serve --db /srv/k/k.db --host 127.0.0.3 --port 9090")


def test_make_run_command_line_wins_over_the_environment() -> None:
    env = {"KEYSVC_PORT": "9090", "KEYSVC_HOST": "127.0.0.3", "KEYSVC_DB": "/srv/k/k.db"}
    lines = dry_run(*INSTALLED, "run", "PORT=9191", "HOST=127.0.0.4", "DB=x/y.db", env=env)
    assert serve_line(lines).endswith("serve --db x/y.db --host 127.0.0.4 --port 9191")


def test_make_run_ignores_a_plain_host_or_port_in_the_environment() -> None:
    """A shell may export HOST as the machine's name; that is no address to bind."""
    lines = dry_run(*INSTALLED, "run", env={"HOST": "myhost", "PORT": "1", "DB": "z.db"})
    assert serve_line(lines).endswith("serve --db var/keysvc.db --host 127.0.0.1 --port 8080")


def test_make_run_really_serves_on_keysvc_port(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "var" / "keysvc.db"
    clean = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    proc = subprocess.Popen(
        [*MAKE, *INSTALLED, "run", f"BIN={Path(sys.executable).parent}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**clean, "KEYSVC_PORT": str(port), "KEYSVC_DB": str(db)},
        start_new_session=True,  # SIGTERM goes to make and the server it runs
    )
    assert proc.stdout is not None
    try:
        # make echoes its recipe lines; bootstrap prints the credentials as one JSON line.
        line = proc.stdout.readline()
        while line and not line.startswith("{"):
            line = proc.stdout.readline()
        created = json.loads(line)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "make run exited"
            assert time.monotonic() < deadline, "make run did not serve"
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/whoami",
                headers=basic(created["keyId"], created["keySecret"]),
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    assert json.load(response)["result"]["id"] == created["id"]
                    break
            except OSError:
                time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    assert db.exists()  # KEYSVC_DB's database, not var/keysvc.db


def install_lines(target: str, venv: Path) -> list[str]:
    """The pip install lines ``make TARGET`` runs on a fresh clone (no virtualenv yet)."""
    lines = dry_run(target, f"VENV={venv}")
    return [line for line in lines if " -m pip install " in line]


def test_make_run_installs_only_what_serving_needs(tmp_path: Path) -> None:
    lines = install_lines("run", tmp_path / "venv")
    assert lines, "make run installs keysvc on a fresh clone"
    assert lines[-1].endswith("--no-build-isolation -e .")
    assert not [line for line in lines if "[test]" in line]
    assert all("-c .ci/constraints.txt" in line for line in lines)


def test_make_test_installs_the_test_and_docs_extras(tmp_path: Path) -> None:
    for target in ("test", "install", "lint", "dist", "docs"):
        lines = install_lines(target, tmp_path / "venv")
        assert lines[-1].endswith("--no-build-isolation -e '.[test,docs]'"), target
        assert all("-c .ci/constraints.txt" in line for line in lines)


def test_system_deps_as_a_user_who_cannot_install_says_what_to_install_and_goes_on() -> None:
    """Not root, no sudo: make system-deps names the commands missing and the packages
    that bring them, and exits 0 so that make test runs everything else."""
    with shared_directory() as directory:
        shutil.copyfile(ROOT / "Makefile", directory / "Makefile")
        (directory / "Makefile").chmod(0o644)
        # A PATH with what the recipe runs and no sudo, even where this user has one.
        tools = directory / "bin"
        tools.mkdir(mode=0o755)
        for tool in ("make", "sh", "id"):
            found = shutil.which(tool)
            assert found, tool
            (tools / tool).symlink_to(found)
        deps = "sh:dash keysvc-absent-a:keysvc-pkg-a keysvc-absent-b:keysvc-pkg-b"
        make = [str(tools / "make"), "--no-print-directory", "system-deps"]
        done = subprocess.run(
            [*unprivileged(), *make, f"SYSTEM_DEPS={deps}"],
            capture_output=True,
            text=True,
            cwd=directory,
            env={"PATH": str(tools), "HOME": "/nonexistent", "LANG": "C.UTF-8"},
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
    """Every command a test requires (``require_command("x", package="y")``) and every
    file (``require_file`` with a constant path, such as nginx's set-misc module) is one make
    test installs, but util-linux's setpriv, which every Debian system has."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("SYSTEM_DEPS ?=")]
    deps = dict(dep.rsplit(":", 1) for dep in line.split("=", 1)[1].split())
    required: dict[str, str] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        source = path.read_text()
        for command, package in re.findall(
            r'require_command\(\s*"([\w-]+)",\s*package="([\w-]+)"', source
        ):
            if package not in {"util-linux", "tool-package", "y"}:
                required[command] = package
        for name, package in re.findall(r'require_file\(\s*(\w+),\s*package="([\w-]+)"', source):
            (value,) = re.findall(rf'^{name} = "([^"]+)"', source, re.M)
            required[value] = package
    assert required == deps
    assert {"chromium", "nginx", "systemd-analyze", "initdb", "wrk"} <= set(deps)
