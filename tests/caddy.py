"""A real Caddy (Debian's package: tests/components.py) running docs/Caddyfile, the
configuration docs/forward-auth/caddy.md shows, as it is: its environment names the site, keysvc's
socket, the upstream and the organization. In front of a real `keysvc serve` on its
unix socket and the echoing upstream of tests/nginx.py. Used by
tests/system/test_caddy.py and test_caddy_hostile.py."""

import os
import subprocess
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.components import require_command, start_listening, stop_group
from tests.helpers import Creds
from tests.nginx import CLIENT, Answer, Upstream, admin_api, call, create_key
from tests.nginxstack import VERIFIED
from tests.server import Server, bootstrap, free_port

CADDYFILE = Path(__file__).resolve().parents[1] / "docs" / "Caddyfile"
# keysvc believes Caddy's X-Forwarded-For on its socket alone; no default rate limit;
# the reuse bound left at its default (Caddy keeps no answer whatever it says).
ENV = {"KEYSVC_TRUSTED_PROXIES": "", "KEYSVC_RATE_LIMIT": "off"}


def caddy_binary() -> str:
    return require_command("caddy", package="caddy")


class Caddy:
    """A real Caddy in the foreground, in its own process group, on a free port, with
    its admin endpoint off and its data and config folders in ``directory``."""

    def __init__(
        self, binary: str, directory: Path, keysvc_socket: Path, upstream: str, organization: str
    ):
        self.binary, self.directory = binary, directory
        self.port = free_port()
        self.out = directory / "caddy.out"
        self.env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(directory),
            "XDG_DATA_HOME": str(directory / "data"),
            "XDG_CONFIG_HOME": str(directory / "config"),
            "KEYSVC_SITE": f"http://127.0.0.1:{self.port}",
            "KEYSVC_BIND": "127.0.0.1",
            "KEYSVC_SOCKET": str(keysvc_socket),
            "KEYSVC_UPSTREAM": upstream.removeprefix("http://"),
            "KEYSVC_ORGANIZATION": organization,
            "CADDY_ADMIN": "off",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, verb: str) -> list[str]:
        return [self.binary, verb, "--config", str(CADDYFILE), "--adapter", "caddyfile"]

    def validate(self) -> str:
        """``caddy validate``: fails unless the configuration is accepted; what it printed."""
        done = subprocess.run(
            self.command("validate"),
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    def start(self) -> None:
        """A port taken between free_port() and Caddy's bind is tried again with
        another, 3 times."""
        for attempt in range(3):
            try:
                self.proc = start_listening(
                    self.command("run"), self.out, self.port, self.log, self.env
                )
                return
            except RuntimeError as failed:
                if "address already in use" not in str(failed) or attempt == 2:
                    raise
                self.port = free_port()
                self.env["KEYSVC_SITE"] = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stop(self) -> None:
        """Graceful stop; whatever is left of its process group is killed."""
        stop_group(self.proc)


@dataclass(frozen=True)
class Stack:
    caddy: Caddy
    keysvc: Server
    keysvc_db: Path
    upstream: Upstream
    admin: Creds

    def get(self, path: str, creds: Creds | None = None, **headers: str) -> Answer:
        """A request through Caddy, from the client's address."""
        sent = {**(creds.headers if creds else {}), **headers}
        return call(self.caddy.port, path, headers=sent, source=CLIENT)

    def through(self, path: str, headers: dict[str, str]) -> tuple[int, int]:
        """One request through Caddy from the client's address: Caddy's status, and how
        many requests the upstream saw for it (0 or 1)."""
        hits = len(self.upstream.seen)
        answer = call(self.caddy.port, path, headers=headers, source=CLIENT)
        return answer.status, len(self.upstream.seen) - hits

    def refused(self, path: str, creds: Creds | None, status: int) -> Answer:
        """Refused with ``status``, and the upstream never saw the request."""
        hits = len(self.upstream.seen)
        answer = self.get(path, creds)
        assert answer.status == status, (answer.status, answer.body, self.caddy.log()[-2000:])
        assert len(self.upstream.seen) == hits, self.upstream.seen[hits:]
        return answer

    def passed(self, path: str, creds: Creds) -> dict[str, Any]:
        """Let through to the upstream; what the upstream received."""
        hits = len(self.upstream.seen)
        answer = self.get(path, creds)
        assert answer.status == 200, (answer.status, answer.body, self.caddy.log()[-2000:])
        assert len(self.upstream.seen) == hits + 1
        received: dict[str, Any] = answer.json()
        assert received == self.upstream.seen[-1]
        return received

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """keysvc's API directly, as the admin; the answer's result."""
        return admin_api(self.keysvc.port, self.admin, method, path, body)

    def create_key(self, **fields: Any) -> Creds:
        return create_key(self.keysvc.port, self.admin, **fields)

    def remaining(self, key: Creds) -> int:
        """The key's credits left, by keysvc's API."""
        return int(self.api("GET", f"/keys/{key.id}")["credits"]["remaining"])

    def verified(self) -> int:
        """How many verify requests reached keysvc so far, by its metrics."""
        with urllib.request.urlopen(self.keysvc.base + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return int(sum(float(count) for count in VERIFIED.findall(text)))


def start_stack(resources: ExitStack, directory: Path, env: dict[str, str] = ENV) -> Stack:
    """keysvc on a unix socket in ``directory``, the upstream, and Caddy in front."""
    binary = caddy_binary()
    db = directory / "keysvc.db"
    created = bootstrap(db)
    admin = Creds(created["organizationId"], created["id"], created["keyId"], created["keySecret"])
    socket_path = directory / "keysvc.sock"
    upstream = Upstream()
    resources.callback(upstream.stop)
    keysvc = resources.enter_context(Server(db, env=env, unix=socket_path))
    caddy = Caddy(binary, directory, socket_path, upstream.base, admin.organization_id)
    caddy.validate()
    resources.callback(caddy.stop)
    caddy.start()
    return Stack(caddy, keysvc, db, upstream, admin)
