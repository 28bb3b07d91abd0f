"""A real nginx running the shipped docs/nginx-auth-request.conf in front of a real
`keysvc serve` on its unix socket and an echoing upstream, for the reuse and hostile-client
tests (tests/system/test_nginx_reuse.py, test_nginx_hostile.py)."""

import re
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import Creds
from tests.nginx import (
    CLIENT,
    Answer,
    Nginx,
    Upstream,
    admin_api,
    call,
    create_key,
    nginx_binary,
)
from tests.server import Server, bootstrap

# KEYSVC_VERIFY_REUSE_SECONDS's default, and the bound the tests hold nginx to.
REUSE_SECONDS = 1
BOUND = REUSE_SECONDS + 0.5
# How long after the bound every request must keep the new answer.
WATCHED = 1.0
VERIFIED = re.compile(
    r'^keysvc_http_requests_total\{[^}]*route="/v1/verify"[^}]*\} ([0-9.]+)$', re.M
)


@dataclass(frozen=True)
class Stack:
    nginx: Nginx
    keysvc: Server
    upstream: Upstream
    admin: Creds

    def get(self, path: str, creds: Creds) -> Answer:
        """A request to the protected upstream through nginx, from the client's address."""
        return call(self.nginx.port, path, headers=creds.headers, source=CLIENT)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """keysvc's API directly, as the admin; the answer's result."""
        return admin_api(self.keysvc.port, self.admin, method, path, body)

    def create_key(self, **fields: Any) -> Creds:
        return create_key(self.keysvc.port, self.admin, **fields)

    def verified(self) -> int:
        """How many verify requests reached keysvc so far, by its metrics."""
        with urllib.request.urlopen(self.keysvc.base + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return int(sum(float(count) for count in VERIFIED.findall(text)))


def start_stack(resources: ExitStack, directory: Path, env: dict[str, str]) -> Stack:
    db = directory / "keysvc.db"
    created = bootstrap(db)
    admin = Creds(created["organizationId"], created["id"], created["keyId"], created["keySecret"])
    socket_path = directory / "keysvc.sock"
    upstream = Upstream()
    resources.callback(upstream.stop)
    keysvc = resources.enter_context(Server(db, env=env, unix=socket_path))
    nginx = Nginx(nginx_binary(), directory, socket_path, upstream.base, admin.organization_id)
    nginx.test_config()
    resources.callback(nginx.stop)
    nginx.start()
    return Stack(nginx, keysvc, upstream, admin)


# keysvc believes nginx's X-Forwarded-For on its socket alone; no default rate limit;
# the reuse bound left at its default.
ENV = {"KEYSVC_TRUSTED_PROXIES": "", "KEYSVC_RATE_LIMIT": "off"}


def early_in_a_second() -> float:
    """Wait for the start of a whole second (so the next answers fall in it); the time."""
    while (now := time.time()) % 1 > 0.3:
        time.sleep(0.02)
    return now
