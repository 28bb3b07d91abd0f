"""A real nginx (Debian's package: tests/components.py) running
docs/nginx-auth-request.conf, the configuration docs/forward-auth/nginx.md shows, filled
in; the tiny
aiohttp upstream it protects, which echoes what it receives; and one HTTP request from
a chosen loopback address. Used by tests/system/test_nginx.py and
test_postgres_nginx.py."""

import asyncio
import http.client
import json
import os
import re
import secrets
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from socket import create_connection
from typing import Any

from aiohttp import web

from tests.api.importing import record
from tests.components import require_command, require_file, start_listening, stop_group
from tests.helpers import Creds
from tests.server import free_port

DOCS = Path(__file__).resolve().parents[1] / "docs"
TEMPLATE = DOCS / "nginx-auth-request.conf"
# The module the template needs (set_hmac_sha256), from Debian's
# libnginx-mod-http-set-misc, and the NDK module it depends on, which that package
# installs with it, loaded before it.
SET_MISC_MODULE = "/usr/lib/nginx/modules/ngx_http_set_misc_module.so"
NDK_MODULE = "/usr/lib/nginx/modules/ndk_http_module.so"
PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# The client's address: loopback, but not the one nginx uses to reach keysvc.
CLIENT = "127.0.0.2"
EXAMPLE_ORGANIZATION = "123e4567-e89b-42d3-a456-426614174000"


def nginx_binary() -> str:
    return require_command("nginx", package="nginx")


def render(
    listen_port: int, keysvc_socket: Path, upstream: str, organization_id: str, cache: Path
) -> str:
    """The template with its placeholders filled in; none may be left over. ``cache``:
    the folder of nginx's cache of keysvc's answers."""
    values = {
        "listen_port": str(listen_port),
        "keysvc_socket": str(keysvc_socket),
        "upstream": upstream,
        "organization_id": organization_id,
        "keysvc_cache": str(cache),
    }
    text = TEMPLATE.read_text()
    unknown = set(PLACEHOLDER.findall(text)) - set(values)
    assert not unknown, f"placeholders the test does not fill: {sorted(unknown)}"
    return PLACEHOLDER.sub(lambda match: values[match[1]], text)


def wrap(directory: Path, server_block: str) -> str:
    """A whole nginx.conf around the template: everything nginx writes stays in
    ``directory``, and as root the workers run as root (the test's files are 0700). It
    loads the modules the template needs, as Debian's modules-enabled does."""
    modules = [NDK_MODULE, require_file(SET_MISC_MODULE, package="libnginx-mod-http-set-misc")]
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "\n".join(
        f"    {kind}_temp_path {directory / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    loads = "".join(f"load_module {module};\n" for module in modules)
    return (
        f"{loads}{user}worker_processes 1;\n"
        "events {\n    worker_connections 64;\n}\n"
        "http {\n"
        f"    access_log {directory / 'access.log'};\n"
        f"{temp}\n"
        f"{server_block}\n"
        "}\n"
    )


class Nginx:
    """A real nginx in the foreground, in its own process group, on a free port."""

    def __init__(
        self,
        binary: str,
        directory: Path,
        keysvc_socket: Path,
        upstream: str,
        organization_id: str = EXAMPLE_ORGANIZATION,
    ):
        self.binary, self.directory = binary, directory
        self.port = free_port()
        self.conf = directory / "nginx.conf"
        self.cache = directory / "keysvc-cache"
        block = render(self.port, keysvc_socket, upstream, organization_id, self.cache)
        self.conf.write_text(wrap(directory, block))
        self.error_log = directory / "error.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, *extra: str) -> list[str]:
        return [
            self.binary,
            *("-p", f"{self.directory}/", "-c", str(self.conf), "-e", str(self.error_log)),
            *("-g", f"daemon off; pid {self.directory / 'nginx.pid'};"),
            *extra,
        ]

    def test_config(self) -> str:
        """``nginx -t``: fails unless the configuration is accepted; returns its output."""
        done = subprocess.run(
            self.command("-t"), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    def start(self) -> None:
        out = self.directory / "nginx.out"
        self.proc = start_listening(self.command(), out, self.port, self.log)

    def log(self) -> str:
        return "\n".join(
            path.read_text(errors="replace")
            for path in (self.directory / "nginx.out", self.error_log)
            if path.exists()
        )

    def stop(self) -> None:
        """Fast shutdown; whatever is left of its process group is killed."""
        stop_group(self.proc)


class Upstream:
    """The protected service: an aiohttp app, on a free loopback port in a thread of
    its own, that answers every request with what it received, and records it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(20) or self._failed is not None:
            self.stop()
            raise RuntimeError(f"upstream did not start: {self._failed!r}")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _echo(self, request: web.Request) -> web.Response:
        record = {
            "method": request.method,
            "path": request.path_qs,
            "raw_path": request.raw_path,
            "headers": dict(request.headers),
            # Every header as received, repeated ones too, in order (bytes as Latin-1).
            "raw_headers": [
                [name.decode("latin-1"), value.decode("latin-1")]
                for name, value in request.raw_headers
            ],
            "body": (await request.read()).decode(),
            # Forwarded as aiohttp's own RFC 7239 parser reads it: one dict an element.
            "forwarded": [dict(element) for element in request.forwarded],
        }
        self.seen.append(record)
        return web.json_response(record)

    def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._echo)
        runner = web.AppRunner(app, access_log=None)
        loop = self._loop
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
            self.port = runner.addresses[0][1]
        except BaseException as exc:
            self._failed = exc
        self._ready.set()
        try:
            if self._failed is None:
                loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        with suppress(RuntimeError):  # already closed: it never started
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: Any = None,
    source: str | None = None,
) -> Answer:
    """One real HTTP request to 127.0.0.1:port, from ``source`` when given."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=10, source_address=(source, 0) if source else None
    )
    sent = dict(headers or {})
    if body is not None:
        sent["Content-Type"] = "application/json"
    try:
        connection.request(method, path, None if body is None else json.dumps(body), sent)
        response = connection.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        connection.close()


def raw(port: int, head: bytes) -> tuple[int, bytes]:
    """A request sent byte for byte from the client's address; the proxy's status and body."""
    status, _, body = raw_answer(port, head)
    return status, body


def raw_answer(port: int, head: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """A request sent byte for byte from the client's address, read to the close: the
    proxy's status, headers (lower-case names, the last of each) and body."""
    with create_connection(("127.0.0.1", port), timeout=timeout, source_address=(CLIENT, 0)) as s:
        s.sendall(head)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head_part, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head_part.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def admin_api(port: int, admin: Creds, method: str, path: str, body: Any = None) -> Any:
    """keysvc's API on ``port`` directly, as ``admin``, under its organization; the
    answer's result."""
    url = f"/v1/organizations/{admin.organization_id}{path}"
    answer = call(port, url, method=method, headers=admin.headers, body=body)
    assert answer.status == 200, answer.body
    return answer.json().get("result")


def create_key(port: int, admin: Creds, **fields: Any) -> Creds:
    """A key made through keysvc's API on ``port`` by ``admin``, with ``fields``."""
    result = admin_api(port, admin, "POST", "/keys", {"name": "behind nginx", **fields})
    return Creds(admin.organization_id, result["key"]["id"], result["keyId"], result["keySecret"])


def import_token(port: int, admin: Creds, token: str, **fields: Any) -> str:
    """A key imported through keysvc's API on ``port`` by ``admin`` from ``token``'s
    hash (``tests.api.importing.record``, with ``fields``); its UUID."""
    made = record(secrets.token_hex(8), token=token, **fields)
    result = admin_api(port, admin, "POST", "/keys/import", {"keys": [made]})
    assert result["errors"] == [], result
    key_id: str = result["keys"][0]["id"]
    return key_id


TWO_INSTANCES = Path(__file__).resolve().parents[1] / "docs" / "nginx-two-instances.conf"
# What docs/nginx-two-instances.conf says to change in the shipped config.
SOCKET_VERIFY = "proxy_pass http://keysvc_verify/v1/verify;"
SHARED_VERIFY = "proxy_pass http://keysvc/v1/verify;"


def filled(text: str, values: dict[str, str]) -> str:
    unknown = set(PLACEHOLDER.findall(text)) - set(values)
    assert not unknown, f"placeholders the test does not fill: {sorted(unknown)}"
    return PLACEHOLDER.sub(lambda match: values[match[1]], text)


def two_instance_config(
    nginx: Nginx, api_port: int, sockets: tuple[Path, Path], upstream: str, organization: str
) -> str:
    """The shipped config with its auth subrequest sent to the ``keysvc`` upstream, as
    docs/nginx-two-instances.conf says, and that file beside it."""
    two = TWO_INSTANCES.read_text()
    assert SOCKET_VERIFY in two and SHARED_VERIFY in two  # the change the file asks for
    socket = Path("/keysvc-is-an-upstream.sock")
    shipped = render(nginx.port, socket, upstream, organization, nginx.cache)
    verify = SOCKET_VERIFY.replace("{keysvc_socket}", str(socket))
    assert shipped.count(verify) == 1
    shipped = shipped.replace(verify, SHARED_VERIFY)
    values = {
        "keysvc_socket_a": str(sockets[0]),
        "keysvc_socket_b": str(sockets[1]),
        "api_port": str(api_port),
        "keysvc_socket": "{keysvc_socket}",  # the shipped config's, named in a comment
    }
    return wrap(nginx.directory, filled(two, values) + "\n" + shipped)
