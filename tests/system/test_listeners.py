"""keysvc serve on a unix socket: who may connect, whose X-Forwarded-For is believed,
workers, a stale socket file, and the warning about a trusted loopback.

All against a real ``keysvc serve``. Over loopback TCP no address is trusted, so a
local process that forges X-Forwarded-For changes nothing; over the unix socket, which
only the proxy can open, the header is believed.
"""

import grp
import http.client
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import ConfigError, build_settings
from tests.helpers import Creds, basic
from tests.server import Server, admin_creds, bootstrap, keysvc

DENIED = "client address not allowed for this key"
FORGE_WARNING = "can connect from loopback and forge X-Forwarded-For"


def tcp_request(
    server: Server, method: str, path: str, headers: dict[str, str], source: str = "127.0.0.1"
) -> tuple[int, Any]:
    """One request to the server's TCP port from ``source``: status and JSON body."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", server.port, timeout=10, source_address=(source, 0)
    )
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def unix_request(
    server: Server, method: str, path: str, headers: dict[str, str]
) -> tuple[int, Any]:
    status, _, body = server.unix_request(method, path, headers)
    return status, json.loads(body or b"null")


def create_key(server: Server, admin: Creds, **fields: Any) -> Creds:
    body = json.dumps({"name": "k", "roles": ["developer"], **fields})
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        headers = {**admin.headers, "Content-Type": "application/json"}
        connection.request("POST", f"/v1/organizations/{admin.organization_id}/keys", body, headers)
        response = connection.getresponse()
        result = json.loads(response.read())["result"]
        assert response.status == 200, result
    finally:
        connection.close()
    return Creds(admin.organization_id, result["key"]["id"], result["keyId"], result["keySecret"])


def log_lines(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.stderr_text().splitlines() if line.startswith("{")]


def forge_warnings(server: Server) -> list[dict[str, Any]]:
    return [line for line in log_lines(server) if FORGE_WARNING in line["message"]]


@pytest.fixture
def socket_path() -> Iterator[Path]:
    # A unix socket's path is limited to 107 bytes; pytest's tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="keysvc-"))
    yield directory / "keysvc.sock"
    shutil.rmtree(directory)


@pytest.fixture
def proxied(tmp_path: Path, socket_path: Path) -> Iterator[tuple[Server, Creds]]:
    """keysvc on loopback TCP and on a unix socket, trusting no proxy address: the
    setting the shipped nginx configuration now asks for."""
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    env = {"KEYSVC_TRUSTED_PROXIES": "", "KEYSVC_RATE_LIMIT": "off"}
    with Server(db, env=env, unix=socket_path) as server:
        yield server, admin
        server.stop()


def test_a_forged_address_opens_no_ip_access_list_over_tcp(proxied: tuple[Server, Creds]) -> None:
    server, admin = proxied
    fenced = create_key(server, admin, ipAccessList=[{"source": "10.0.0.0/8"}])
    forged = {**fenced.headers, "X-Forwarded-For": "10.1.1.1"}
    status, body = tcp_request(server, "GET", "/v1/verify", forged)
    assert (status, body["error"]) == (403, DENIED)
    # Through the unix socket, only the proxy speaks: its X-Forwarded-For is the client.
    status, _ = unix_request(server, "GET", "/v1/verify", forged)
    assert status == 200
    status, body = unix_request(
        server, "GET", "/v1/verify", {**fenced.headers, "X-Forwarded-For": "192.0.2.1"}
    )
    assert (status, body["error"]) == (403, DENIED)
    # No X-Forwarded-For from the proxy: the client's address is unknown, so not allowed.
    status, body = unix_request(server, "GET", "/v1/verify", fenced.headers)
    assert (status, body["error"]) == (403, DENIED)


def test_forged_addresses_do_not_escape_the_failed_login_limit(
    proxied: tuple[Server, Creds],
) -> None:
    server, admin = proxied
    wrong = basic(admin.key_id, "keysvc_wrong")
    statuses = [
        tcp_request(
            server, "GET", "/v1/verify", {**wrong, "X-Forwarded-For": f"10.0.{n // 250}.{n % 250}"},
            source="127.0.0.5",
        )[0]
        for n in range(100)
    ]  # fmt: skip
    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    # The forger's own address is the one refused, valid credentials included.
    assert tcp_request(server, "GET", "/v1/verify", admin.headers, source="127.0.0.5")[0] == 429


def test_a_forged_address_does_not_lock_out_the_real_client(proxied: tuple[Server, Creds]) -> None:
    server, admin = proxied
    victim = "127.0.0.10"
    wrong = {**basic(admin.key_id, "keysvc_wrong"), "X-Forwarded-For": victim}
    for _ in range(25):
        tcp_request(server, "GET", "/v1/verify", wrong, source="127.0.0.6")
    assert tcp_request(server, "GET", "/v1/verify", admin.headers, source=victim)[0] == 200
    through_proxy = {**admin.headers, "X-Forwarded-For": victim}
    assert unix_request(server, "GET", "/v1/verify", through_proxy)[0] == 200
    # Over the socket the forwarded address is the one counted: the same 20 failures
    # from a client behind the proxy lock out that client, not the next one.
    for _ in range(20):
        status, _ = unix_request(
            server, "GET", "/v1/verify", {**wrong, "X-Forwarded-For": "192.0.2.50"}
        )
        assert status == 401
    blocked = {**admin.headers, "X-Forwarded-For": "192.0.2.50"}
    assert unix_request(server, "GET", "/v1/verify", blocked)[0] == 429
    other = {**admin.headers, "X-Forwarded-For": "192.0.2.51"}
    assert unix_request(server, "GET", "/v1/verify", other)[0] == 200


def test_the_socket_file_is_0660_with_its_group_and_removed_at_stop(
    tmp_path: Path, socket_path: Path
) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    # A group other than the process's own, which root may give the file.
    group = next(g for g in grp.getgrall() if g.gr_gid != os.getegid())
    env = {"KEYSVC_UNIX_GROUP": group.gr_name}
    with Server(db, env=env, unix=socket_path, tcp=False) as server:
        info = os.stat(socket_path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o660
        assert info.st_gid == group.gr_gid
        status, body = unix_request(server, "GET", "/v1/whoami", admin.headers)
        assert status == 200, body
        assert server.stop() < 8
        assert server.proc.returncode == 0
    assert not socket_path.exists()


def test_workers_serve_one_unix_socket(tmp_path: Path, socket_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env={"KEYSVC_WORKERS": "2"}, unix=socket_path, tcp=False) as server:
        workers = [int(pid) for pid in _children(server.proc.pid)]
        assert len(workers) == 2
        # Server() saw one worker answer; the other may still be opening the database
        # (a write tried and rolled back), and pausing it there would hold the lock.
        _wait_until_serving(server, 2)
        # With one worker stopped, the other still answers every request on the socket.
        for paused in workers:
            os.kill(paused, signal.SIGSTOP)
            try:
                for _ in range(5):
                    assert unix_request(server, "GET", "/v1/whoami", admin.headers)[0] == 200
            finally:
                os.kill(paused, signal.SIGCONT)
        assert server.stop() < 8
        assert server.proc.returncode == 0
    assert not socket_path.exists()


def _wait_until_serving(server: Server, workers: int) -> None:
    deadline = time.monotonic() + 20
    while server.stderr_text().count("Running on") < workers:
        assert time.monotonic() < deadline, server.stderr_text()
        time.sleep(0.05)


def _children(pid: int) -> set[str]:
    found: set[str] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= set((task / "children").read_text().split())
    return found


def test_a_stale_socket_file_does_not_stop_a_restart(tmp_path: Path, socket_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, unix=socket_path, tcp=False) as server:
        # A second server is refused the socket the first one still serves on.
        second = keysvc("serve", "--db", str(db), "--tcp", "off", "--unix", str(socket_path))
        assert second.returncode == 2
        assert f"unix: a server is already listening on {socket_path}" in second.stderr
        server.proc.kill()
        server.proc.wait()
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)  # left behind
    with Server(db, unix=socket_path, tcp=False) as server:
        assert unix_request(server, "GET", "/v1/whoami", admin.headers)[0] == 200
        server.stop()


def test_a_file_that_is_not_a_socket_is_left_alone(socket_path: Path, tmp_path: Path) -> None:
    socket_path.write_text("keep me")
    done = keysvc(
        "serve", "--db", str(tmp_path / "k.db"), "--tcp", "off", "--unix", str(socket_path)
    )
    assert done.returncode == 2
    assert f"unix: {socket_path} exists and is not a socket" in done.stderr
    assert socket_path.read_text() == "keep me"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KEYSVC_UNIX": "run/keysvc.sock"}, "unix: 'run/keysvc.sock' must be an absolute path"),
        ({"KEYSVC_UNIX_GROUP": "no-such-group-here"}, "unix-group: 'no-such-group-here' is no"),
        ({"KEYSVC_TCP": "maybe"}, "tcp: 'maybe' must be on or off"),
    ],
)
def test_bad_socket_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env=env)
    assert str(caught.value).startswith(message)


def test_listening_nowhere_is_refused(tmp_path: Path) -> None:
    done = keysvc("serve", "--db", str(tmp_path / "k.db"), "--tcp", "off")
    assert done.returncode == 2
    assert "tcp: off needs --unix PATH" in done.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_trusting_loopback_while_serving_loopback_tcp_is_warned_once(
    tmp_path: Path, workers: str
) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    env = {"KEYSVC_TRUSTED_PROXIES": "10.0.0.0/8,127.0.0.1/32", "KEYSVC_WORKERS": workers}
    with Server(db, env=env) as server:
        server.stop()
        (warning,) = forge_warnings(server)
    assert warning["level"] == "warning"
    assert "127.0.0.1/32" in warning["message"] and "10.0.0.0/8" not in warning["message"]
    assert "--unix" in warning["message"]


@pytest.mark.parametrize(
    ("trusted", "tcp"), [("10.0.0.0/8", True), ("", True), ("127.0.0.1/32", False)]
)
def test_no_warning_when_no_local_process_is_trusted(
    tmp_path: Path, socket_path: Path, trusted: str, tcp: bool
) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    env = {"KEYSVC_TRUSTED_PROXIES": trusted}
    with Server(db, env=env, unix=socket_path, tcp=tcp) as server:
        server.stop()
        assert forge_warnings(server) == []
        assert any("Running on http://unix:" in line["message"] for line in log_lines(server))
