"""docs/nginx-two-instances.conf with the shipped docs/nginx-auth-request.conf, through a
real nginx, in front of a real `keysvc serve` (SQLite) whose socket is the second
instance, while the first is a relay to that same keysvc: it passes each request on and
keysvc's answer back, except for an auth subrequest, whose answer it reads (keysvc has
carried it out: credits spent) and then drops, closing nginx's connection, as an
instance killed between its COMMIT and its reply would. A request is never charged
twice: nginx does not send an auth subrequest already sent to another instance. And the
API's public port refuses keysvc's operator routes (/metrics, /healthz, /readyz).
"""

import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import Creds
from tests.nginx import (
    CLIENT,
    Nginx,
    Upstream,
    admin_api,
    call,
    create_key,
    nginx_binary,
    two_instance_config,
)
from tests.server import Server, admin_creds, bootstrap, free_port

# The auth subrequest's path, as nginx sends it to an instance.
VERIFY_LINE = b" /v1/verify HTTP/1.1\r\n"
ENV = {"KEYSVC_TRUSTED_PROXIES": "", "KEYSVC_RATE_LIMIT": "off"}


class Relay:
    """A unix socket that relays each connection's one request to keysvc's socket, with
    Connection: close; it answers with keysvc's answer, but for an auth subrequest it
    closes without a byte. ``dropped``: the auth subrequests keysvc answered that way."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path, self.target = path, target
        self.dropped: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(64)
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn, socket.socket(socket.AF_UNIX) as keysvc:
            request = b""
            while b"\r\n\r\n" not in request and (chunk := conn.recv(65536)):
                request += chunk
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [
                line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")
            ]
            keysvc.connect(str(self.target))
            keysvc.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)
            answer = b""
            while chunk := keysvc.recv(65536):
                answer += chunk
            if VERIFY_LINE in lines[0] + b"\r\n":
                self.dropped.append(answer.split(b"\r\n", 1)[0])
                return  # closed: nginx never gets keysvc's answer
            conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()


@dataclass(frozen=True)
class Stack:
    nginx: Nginx
    api_port: int
    keysvc: Server
    relay: Relay
    admin: Creds


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    admin = admin_creds(bootstrap(tmp_path / "keysvc.db"))
    real, relayed = tmp_path / "keysvc.sock", tmp_path / "relay.sock"
    with ExitStack() as resources:
        upstream = Upstream()
        resources.callback(upstream.stop)
        keysvc = resources.enter_context(Server(tmp_path / "keysvc.db", env=ENV, unix=real))
        relay = Relay(relayed, real)
        resources.callback(relay.close)
        nginx = Nginx(nginx_binary(), tmp_path, real, upstream.base, admin.organization_id)
        api_port = free_port()
        nginx.conf.write_text(
            two_instance_config(
                nginx, api_port, (relayed, real), upstream.base, admin.organization_id
            )
        )
        nginx.test_config()
        resources.callback(nginx.stop)
        nginx.start()
        yield Stack(nginx, api_port, keysvc, relay, admin)


def remaining(stack: Stack, key: Creds) -> int:
    credits: int = admin_api(stack.keysvc.port, stack.admin, "GET", f"/keys/{key.id}")["credits"][
        "remaining"
    ]
    return credits


def test_an_auth_subrequest_an_instance_carried_out_is_never_sent_to_the_other(
    stack: Stack,
) -> None:
    key = create_key(
        stack.keysvc.port, stack.admin, roles=["developer"], credits={"remaining": 100}
    )
    statuses = [
        call(stack.nginx.port, "/orders", headers=key.headers, source=CLIENT).status
        for _ in range(6)
    ]
    assert stack.relay.dropped == [b"HTTP/1.1 200 OK"], stack.nginx.log()[-2000:]
    # The request whose answer was lost is not answered 200, and nothing is spent twice.
    assert sorted(statuses) == [200] * 5 + [500], statuses
    assert 100 - remaining(stack, key) == 6


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/METRICS", "/metrics/"])
def test_the_api_port_refuses_keysvc_s_operator_routes(stack: Stack, path: str) -> None:
    answer = call(stack.api_port, path, source=CLIENT)
    assert answer.status == 404, (answer.status, answer.body[:200])
    assert b"keysvc_" not in answer.body


def test_the_api_port_still_serves_keysvc_s_api(stack: Stack) -> None:
    for _ in range(4):  # round robin: both instances
        url = f"/v1/organizations/{stack.admin.organization_id}/keys"
        answer = call(stack.api_port, url, headers=stack.admin.headers, source=CLIENT)
        assert answer.status == 200, answer.body
