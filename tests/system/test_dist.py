"""make dist: one file that runs keysvc with a plain python3, no virtualenv.

The build is ``make dist`` itself, writing into a temporary folder. It installs
keysvc's dependencies from PyPI into the zip (pip's cache makes a rebuild take
seconds). The zip then runs with the interpreter this virtualenv was made
from, in isolated mode (``-I``: no PYTHONPATH, no user site, not the current
folder), so everything it imports comes from the zip or the standard library:
first as a user runs it, with no SHIV_ROOT (it unpacks into the home folder),
then as docs/keysvc.service runs it, as an unprivileged user with no home and
the unit's SHIV_ROOT in a state directory only that user can enter.
"""

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from tests import constraints
from tests.components import give_to_unprivileged, shared_directory, unprivileged
from tests.helpers import basic
from tests.server import free_port

ROOT = Path(__file__).resolve().parents[2]
# The systemd section moved from the README to the docs site (issue 38).
SYSTEMD_PAGE = (ROOT / "docs" / "operations" / "systemd.md").read_text()


def base_python() -> str:
    """The interpreter this virtualenv was made from: the PYTHON the Makefile was given.

    Not ``shutil.which("python3")``: on PATH that can be this virtualenv's own
    python (when it is activated), or a Python of another minor version, which
    cannot load the compiled wheels (aiohttp's) the zip carries for this one.
    """
    return getattr(sys, "_base_executable", sys.executable)


def call(base: str, path: str, **request: Any) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(base + path, **request), timeout=10
        ) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + 60  # the first start unpacks the zip
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited {proc.returncode}: {log.read_text()}"
        try:
            return call(base, "/readyz")
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"serve did not answer: {log.read_text()}")


def test_dist_builds_one_file_that_serves_with_plain_python(tmp_path: Path) -> None:
    python = base_python()
    plain = subprocess.run(
        [python, "-I", "-c", "import sys; print(sys.prefix == sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.strip() == "True", f"{python} is inside a virtualenv"

    make = shutil.which("make")
    assert make, "make is a prerequisite (README)"
    pyz = tmp_path / "dist" / "keysvc.pyz"
    # BIN: the shiv of the environment running this test. -o: never reinstall
    # that environment from under the running tests.
    command = [make, "--no-print-directory", "-C", str(ROOT)]
    command += ["-o", ".venv/.installed-stamp", "-o", ".venv/.installed-test-stamp"]
    command += ["dist", f"PYZ={pyz}", f"BIN={Path(sys.executable).parent}"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")

    names = zipfile.ZipFile(pyz).namelist()
    assert "site-packages/keysvc/schema.sql" in names
    # The console's page and files, which /console serves from the package.
    console = {
        f"site-packages/keysvc/console/{f.name}" for f in (ROOT / "keysvc/console").iterdir()
    }
    assert console <= set(names), console - set(names)
    packed = {
        canonicalize_name(match[1]): match[2]
        for name in names
        if (match := re.fullmatch(r"site-packages/([^/-]+)-([^/-]+)\.dist-info/METADATA", name))
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        wanted = canonicalize_name(re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0])
        assert wanted in packed, f"{requirement} is not in the zip"
    # Each package in the zip at the version make install pins, as tested here.
    pins = constraints.pins()
    unpinned = {
        name: (version, pins.get(name))
        for name, version in packed.items()
        if name != "keysvc"
        and (name not in pins or not constraints.same_version(version, pins[name]))
    }
    assert not unpinned, f"in the zip vs pinned: {unpinned}"

    # As a user runs it: no SHIV_ROOT, so it unpacks into the home folder's .shiv.
    home = tmp_path / "home"
    home.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("SHIV_")}
    env["HOME"] = str(home)
    run = [python, "-I", str(pyz)]
    db = tmp_path / "x.db"
    booted = subprocess.run(
        [*run, "bootstrap", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert booted.returncode == 0, booted.stderr
    admin = json.loads(booted.stdout)
    # It ran keysvc from the unpacked zip, schema.sql included.
    assert list((home / ".shiv").glob("*/site-packages/keysvc/schema.sql"))

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        proc = subprocess.Popen(
            [*run, "serve", "--db", str(db), "--port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        status, body = wait_ready(base, proc, log)
        assert status == 200, body
        assert (body["status"], body["result"]) == (200, {"status": "ready"})

        keys = f"/v1/organizations/{admin['organizationId']}/keys"
        status, body = call(
            base,
            keys,
            method="POST",
            data=json.dumps({"name": "from the zip", "roles": ["developer"]}).encode(),
            headers={
                **basic(admin["keyId"], admin["keySecret"]),
                "Content-Type": "application/json",
            },
        )
        assert status == 200, body
        new = body["result"]
        status, body = call(
            base,
            f"{keys}/{new['key']['id']}",
            headers=basic(new["keyId"], new["keySecret"]),
        )
        assert status == 200, body
        assert (body["result"]["id"], body["result"]["name"]) == (new["key"]["id"], "from the zip")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    run_as_the_systemd_unit(pyz)


def unit_python() -> str:
    """The unit's /usr/bin/python3 when it is this Python's minor version (the zip's
    compiled wheels are for that one), else the interpreter this virtualenv was made
    from; either must be one the unprivileged user can run."""
    system = Path("/usr/bin/python3")
    if system.exists():
        done = subprocess.run(
            [str(system), "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=True,
        )
        if done.stdout.strip() == str(sys.version_info[:2]):
            return str(system)
    return base_python()


# The unit's user: a system user with no home (useradd --no-create-home), and none of
# this test's environment.
NO_HOME = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


def run_as_the_systemd_unit(pyz: Path) -> None:
    """docs/keysvc.service's command line and environment, then the bootstrap of
    docs/operations/systemd.md.

    What needs a running systemd (useradd, systemctl) cannot run here; the unit
    itself is checked by systemd-analyze in tests/system/test_readme.py. This runs what
    systemd would run: ExecStart with the unit's Environment and nothing else, as an
    unprivileged user with no home, on an empty state directory that user owns
    (0700), with /opt/keysvc and /var/lib/keysvc moved to a temporary folder and the
    port made free. It refuses the empty state directory (serve makes no database);
    after that bootstrap it serves, the admin key works, and the unit's
    KillSignal stops it within TimeoutStopSec.
    Then the unpacked zip is tampered with, and it refuses to start; and with no
    SHIV_ROOT and no home it cannot unpack at all.
    """
    unit = (ROOT / "docs" / "keysvc.service").read_text()
    setting = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    with shared_directory() as shared:
        installed = shared / "opt" / "keysvc.pyz"
        installed.parent.mkdir(mode=0o755)
        shutil.copyfile(pyz, installed)
        installed.chmod(0o644)
        state = shared / "var-lib" / setting["StateDirectory"]
        state.mkdir(parents=True)
        (shared / "var-lib").chmod(0o755)
        give_to_unprivileged(state, int(setting["StateDirectoryMode"], 8))
        runtime = shared / "run" / setting["RuntimeDirectory"]
        runtime.mkdir(parents=True)
        (shared / "run").chmod(0o755)
        give_to_unprivileged(runtime, int(setting["RuntimeDirectoryMode"], 8))

        def moved(text: str) -> str:
            text = text.replace("/opt/keysvc/keysvc.pyz", str(installed))
            text = text.replace(f"/run/{setting['RuntimeDirectory']}", str(runtime))
            return text.replace(f"/var/lib/{setting['StateDirectory']}", str(state))

        unit_env = {
            name: moved(value)
            for name, value in re.findall(r"^Environment=(\w+)=(.*)$", unit, re.M)
        }
        assert unit_env["SHIV_ROOT"].startswith(f"{state}/")  # inside the 0700 state directory
        port = free_port()
        unit_env["KEYSVC_PORT"] = str(port)
        python, *args = moved(setting["ExecStart"]).split()
        assert python == "/usr/bin/python3"
        command = [*unprivileged(), unit_python(), "-I", *args]
        env = {**NO_HOME, **unit_env}
        # On the empty state directory it refuses to start: serve makes no database.
        refused = subprocess.run(
            command, capture_output=True, text=True, timeout=60, env=env, cwd="/", check=False
        )
        assert refused.returncode == 2, refused.stderr
        assert f"no database at {state / 'keysvc.db'}" in refused.stderr
        assert not (state / "keysvc.db").exists()
        admin = bootstrap_as_the_readme(command, env, moved)
        serve_as_the_unit(command, env, port, setting, admin)
        assert (state / "keysvc.db").exists()
        (site_packages,) = Path(unit_env["SHIV_ROOT"]).glob("keysvc.pyz_*/site-packages")
        refuses_a_tampered_unpack(command, {**NO_HOME, **unit_env}, site_packages)

        # With no SHIV_ROOT and no home there is nowhere to unpack: it stops there.
        homeless = ask_for_help(command, NO_HOME)
        assert homeless.returncode != 0, homeless.stdout
        last = homeless.stderr.strip().splitlines()[-1]
        assert last == "PermissionError: [Errno 13] Permission denied: '/nonexistent'", (
            homeless.stderr
        )


def ask_for_help(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` (the unit's, ending in ``serve``) asked for ``--help`` instead: the
    zip unpacks and keysvc is imported, as for serve, and it exits."""
    return subprocess.run(
        [*command[:-1], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
        check=False,
    )


def bootstrap_as_the_readme(
    command: list[str], env: dict[str, str], moved: Callable[[str], str]
) -> dict[str, Any]:
    """The systemd page's bootstrap, as the service's user, unpacking where the service does;
    the admin key it printed."""
    (shown,) = re.findall(r"^sudo -u keysvc env (.*bootstrap.*)$", SYSTEMD_PAGE, re.M)
    *assignments, python, pyz, bootstrap = moved(shown).split(maxsplit=3)
    assert (python, bootstrap.split()[0]) == ("python3", "bootstrap")
    readme_env = dict(assignment.split("=", 1) for assignment in assignments)
    assert readme_env == {"SHIV_ROOT": env["SHIV_ROOT"]}
    booted = subprocess.run(
        [*command[:-2], pyz, *bootstrap.split()],
        capture_output=True,
        text=True,
        timeout=60,
        env={**NO_HOME, **readme_env},
        cwd="/",
        check=False,
    )
    assert booted.returncode == 0, booted.stderr
    admin: dict[str, Any] = json.loads(booted.stdout)
    return admin


def serve_as_the_unit(
    command: list[str],
    env: dict[str, str],
    port: int,
    setting: dict[str, str],
    admin: dict[str, Any],
) -> None:
    """The unit's command serves the bootstrapped database, the admin key works, and
    the unit's KillSignal stops it within TimeoutStopSec."""
    log = Path(env["KEYSVC_DB"]).with_name("unit.log")
    with open(log, "wb") as output:
        proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd="/")
    try:
        base = f"http://127.0.0.1:{port}"
        status, body = wait_ready(base, proc, log)
        assert status == 200, body
        status, body = call(base, "/v1/whoami", headers=basic(admin["keyId"], admin["keySecret"]))
        assert (status, body["result"]["id"]) == (200, admin["id"]), body
        # And on the unit's unix socket, in its runtime folder: 0660, nginx's way in.
        unix = Path(env["KEYSVC_UNIX"])
        assert stat.S_ISSOCK(unix.stat().st_mode), unix
        assert stat.S_IMODE(unix.stat().st_mode) == 0o660
        assert setting["KillSignal"] == "SIGTERM"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=float(setting["TimeoutStopSec"])) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def refuses_a_tampered_unpack(command: list[str], env: dict[str, str], site: Path) -> None:
    """A .py file changed or added where the zip unpacked: the zip refuses to run it
    (make dist builds with shiv's --no-modify), and runs again once it is undone."""

    changed = site / "keysvc" / "__init__.py"
    original = changed.read_bytes()
    added = site / "keysvc" / "added.py"
    for tamper in (
        lambda: changed.write_bytes(original + b"\nprint('not from the zip')\n"),
        lambda: added.write_text("print('not from the zip')\n"),
    ):
        tamper()
        refused = ask_for_help(command, env)
        assert "not from the zip" not in refused.stdout + refused.stderr
        assert refused.returncode != 0, refused.stdout + refused.stderr
        assert "A Python source file has been modified!" in refused.stderr, refused.stderr
        changed.write_bytes(original)
        added.unlink(missing_ok=True)
    again = ask_for_help(command, env)
    assert again.returncode == 0, again.stderr
