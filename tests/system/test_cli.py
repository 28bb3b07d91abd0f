"""The keysvc command: settings precedence, bootstrap, serve and SIGTERM."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import ConfigError, build_settings
from tests.helpers import basic
from tests.server import Server, bootstrap, free_port, integrity, keysvc

ROOT = Path(__file__).resolve().parents[2]


def test_flags_win_over_env_over_defaults() -> None:
    env = {"KEYSVC_DB": "/env.db", "KEYSVC_HOST": "0.0.0.0", "KEYSVC_PORT": "9000"}
    defaults = build_settings(env={})
    assert (str(defaults.db_path), defaults.host, defaults.port) == (
        "var/keysvc.db",
        "127.0.0.1",
        8080,
    )
    assert (defaults.max_keys_per_org, defaults.trusted_proxies, defaults.pepper) == (
        1000,
        (),
        None,
    )
    from_env = build_settings(env=env)
    assert (str(from_env.db_path), from_env.host, from_env.port) == ("/env.db", "0.0.0.0", 9000)
    flags = build_settings({"db_path": "/flag.db", "host": "::1", "port": "9100"}, env=env)
    assert (str(flags.db_path), flags.host, flags.port) == ("/flag.db", "::1", 9100)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KEYSVC_PORT": "eighty"}, "port: 'eighty' is not a number"),
        ({"KEYSVC_PORT": "70000"}, "port: 70000 is outside 0..65535"),
        ({"KEYSVC_PEPPER": "short"}, "KEYSVC_PEPPER: must be at least 32 bytes"),
        ({"KEYSVC_MAX_KEYS_PER_ORG": "0"}, "max-keys-per-org: 0 must be at least 1"),
        (
            {"KEYSVC_TRUSTED_PROXIES": "10.0.0.1/8"},
            "trusted-proxies: '10.0.0.1/8' is not an IP address or CIDR",
        ),
        ({"KEYSVC_DB": ":memory:"}, "db: must be a file path; keysvc keeps its keys on disk"),
        ({"KEYSVC_HEADER_TIMEOUT": "soon"}, "header-timeout: 'soon' is not a number of seconds"),
        (
            {"KEYSVC_IDLE_TIMEOUT": "0"},
            "idle-timeout: 0 must be more than 0 and less than 86400 seconds",
        ),
        (
            {"KEYSVC_HEADER_TIMEOUT": "nan"},
            "header-timeout: nan must be more than 0 and less than 86400 seconds",
        ),
        ({"KEYSVC_MAX_CONNECTIONS": "0"}, "max-connections: 0 must be at least 1"),
        (
            {"KEYSVC_LOOP": "tokio"},
            "loop: 'tokio' is not an event loop; use one of asyncio, uvloop",
        ),
    ],
)
def test_bad_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env=env)
    assert str(caught.value) == message


def test_bad_setting_stops_the_command_with_one_line(tmp_path: Path) -> None:
    done = keysvc("serve", "--db", str(tmp_path / "k.db"), "--port", "eighty")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["keysvc: port: 'eighty' is not a number"]


def test_bootstrap_prints_one_json_object(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    done = keysvc("bootstrap", "--db", str(db), "--org-name", "acme")
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)  # exactly one JSON document
    assert set(created) == {"organizationId", "id", "keyId", "keySecret"}
    assert done.stdout.count("\n") == 1
    org = sqlite3.connect(db).execute("select name from organizations").fetchall()
    assert org == [("acme",)]


def test_bootstrap_if_empty_does_nothing_the_second_time(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    assert keysvc("bootstrap", "--if-empty", "--db", str(db)).stdout.strip()
    again = keysvc("bootstrap", "--if-empty", "--db", str(db))
    assert again.returncode == 0 and again.stdout == ""
    assert sqlite3.connect(db).execute("select count(*) from organizations").fetchone() == (1,)


def test_wrong_pepper_stops_start(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    done = keysvc("bootstrap", "--db", str(db), env={"KEYSVC_PEPPER": "p" * 40})
    assert done.returncode == 2
    assert "the pepper does not match this database" in done.stderr


def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    created = bootstrap(db)
    with Server(db) as server:
        request = urllib.request.Request(
            f"{server.base}/v1/organizations/{created['organizationId']}/keys/{created['id']}",
            headers=basic(created["keyId"], created["keySecret"]),
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["result"]["id"] == created["id"]
        took = server.stop()
        assert server.proc.returncode == 0
        assert took < 5
    # The database was closed: the WAL was checkpointed and removed on close.
    assert not Path(f"{db}-wal").exists()
    assert integrity(db) == ["ok"]


def test_a_bad_event_loop_stops_serve_with_one_line(tmp_path: Path) -> None:
    done = keysvc("serve", "--db", str(tmp_path / "k.db"), "--loop", "trio")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "keysvc: loop: 'trio' is not an event loop; use one of asyncio, uvloop"
    ]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_serve_on_either_loop_answers_and_stops_cleanly_on_sigterm(
    tmp_path: Path, loop: str
) -> None:
    db = tmp_path / "k.db"
    created = bootstrap(db)
    with Server(db, args=["--loop", loop]) as server:
        request = urllib.request.Request(
            f"{server.base}/v1/verify", headers=basic(created["keyId"], created["keySecret"])
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["X-Key-Id"] == created["id"]
        took = server.stop()
        assert server.proc.returncode == 0
        assert took < 5
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    (started,) = [line for line in lines if line["message"].startswith("Running on")]
    assert f"event loop {loop} " in started["message"]  # the loop that ran, by its module
    assert lines[-1]["message"] == "stopped"
    assert integrity(db) == ["ok"]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def test_workers_share_one_port_and_stop_together(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    created = bootstrap(db)
    with Server(db, env={"KEYSVC_WORKERS": "2"}) as server:
        workers = _children(server.proc.pid)
        assert len(workers) == 2
        for _ in range(20):
            request = urllib.request.Request(
                f"{server.base}/v1/verify", headers=basic(created["keyId"], created["keySecret"])
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.status == 200
                assert response.headers["X-Key-Id"] == created["id"]
        took = server.stop()
        assert server.proc.returncode == 0
        assert took < 8
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists()  # the parent waited for each worker


def test_workers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the supervising parent leaves no worker serving on without it: each
    is told of its parent's death (SIGTERM) and stops cleanly."""
    db = tmp_path / "k.db"
    bootstrap(db)
    with Server(db, env={"KEYSVC_WORKERS": "2"}) as server:
        workers = _children(server.proc.pid)
        assert len(workers) == 2
        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in workers):
            assert time.monotonic() < deadline, f"orphaned workers still run: {workers}"
            time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def make_run(db: Path, port: int) -> subprocess.Popen[str]:
    """``make run`` as the README gives it, on a temporary database and a free port.

    BIN and ``-o`` keep make from reinstalling the environment running the tests.
    """
    command = ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.installed-stamp"]
    command += ["run", f"DB={db}", f"PORT={port}", f"BIN={Path(sys.executable).parent}"]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # SIGTERM goes to make and the server it runs
    )


def stop(proc: subprocess.Popen[str]) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    return out


def wait_serving(base: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "make run exited"
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=1) as response:
                assert response.status == 200
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("make run did not serve")


def test_make_run_bootstraps_once_then_serves(tmp_path: Path) -> None:
    db = tmp_path / "var" / "keysvc.db"  # make run creates the folder
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    first = make_run(db, port)
    try:
        wait_serving(base, first)
    finally:
        out = stop(first)
    (line,) = [line for line in out.splitlines() if line.startswith("{")]
    created = json.loads(line)

    second = make_run(db, port)  # the same database: nothing new is printed
    try:
        wait_serving(base, second)
        request = urllib.request.Request(
            base + "/v1/whoami", headers=basic(created["keyId"], created["keySecret"])
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["result"]["id"] == created["id"]
    finally:
        out = stop(second)
    assert not [line for line in out.splitlines() if line.startswith("{")]


def _key_count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        (count,) = conn.execute("select count(*) from api_keys").fetchone()
        return int(count)
    finally:
        conn.close()


def _whoami(base: str, creds: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/v1/whoami", headers=basic(creds["keyId"], creds["keySecret"])
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        result: dict[str, Any] = json.load(response)["result"]
        return result


def test_admin_key_mints_a_key_the_running_server_accepts_at_once(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    first = bootstrap(db)
    with Server(db) as server:
        assert _whoami(server.base, first)["id"] == first["id"]  # its cache is warm
        done = keysvc("admin-key", "--db", str(db), "--name", "recovery")
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("\n") == 1
        minted = json.loads(done.stdout)
        assert set(minted) == {"organizationId", "id", "keyId", "keySecret"}
        assert minted["organizationId"] == first["organizationId"]
        assert minted["id"] != first["id"]
        me = _whoami(server.base, minted)
        assert (me["id"], me["name"]) == (minted["id"], "recovery")
        assert [role["roleName"] for role in me["assignedRoles"]] == ["admin"]
        assert _whoami(server.base, first)["id"] == first["id"]  # the old key still works
        server.stop()
        assert server.proc.returncode == 0
    assert _key_count(db) == 2


def test_admin_key_asks_which_organization_when_there_are_several(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    orgs = [bootstrap(db, "--org-name", name)["organizationId"] for name in ("a", "b")]
    done = keysvc("admin-key", "--db", str(db))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "keysvc: the database holds several organizations; pick one with --org: " + " ".join(orgs)
    ]
    unknown = keysvc("admin-key", "--db", str(db), "--org", "not-an-org")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        "keysvc: org: no organization 'not-an-org' in this database"
    ]
    assert _key_count(db) == 2
    chosen = keysvc("admin-key", "--db", str(db), "--org", orgs[1])
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["organizationId"] == orgs[1]
    assert _key_count(db) == 3


def test_admin_key_keeps_to_the_key_limit(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    for done in (
        keysvc("admin-key", "--db", str(db), env={"KEYSVC_MAX_KEYS_PER_ORG": "1"}),
        keysvc("admin-key", "--db", str(db), "--max-keys-per-org", "1"),
    ):
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            "keysvc: admin-key: this organization has reached its limit of 1 keys"
        ]
        assert done.stdout == ""
    assert _key_count(db) == 1


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("   ", "name: must be 1 to 255 characters"),
        ("x" * 256, "name: must be 1 to 255 characters"),
        ("bell\x07", "name: must not contain control characters"),
    ],
)
def test_admin_key_name_follows_the_create_rules(tmp_path: Path, name: str, error: str) -> None:
    db = tmp_path / "k.db"
    bootstrap(db)
    done = keysvc("admin-key", "--db", str(db), "--name", name)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"keysvc: admin-key: {error}"]
    assert _key_count(db) == 1


def test_admin_key_needs_a_bootstrapped_database(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    done = keysvc("admin-key", "--db", str(db))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"keysvc: no database at {db}: make one with `keysvc bootstrap --db {db}`,"
        " or correct the path"
    ]
    assert not db.exists()
