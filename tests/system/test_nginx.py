"""keysvc as the authority behind a real nginx's auth_request, all real processes.

docs/nginx-auth-request.conf, the configuration docs/forward-auth/nginx.md shows, is
filled in and run
by a real nginx (Debian's package: tests/components.py) in front of a
tiny aiohttp upstream that echoes the headers it receives, with a real `keysvc serve`
deciding, reached over its unix socket. Everything else listens on loopback. The client
connects from 127.0.0.2, so keysvc can only learn that address from nginx's
X-Forwarded-For, which it believes on the socket alone: it trusts no TCP peer. Every
refusal is also checked to never reach the upstream.
"""

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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
from tests.server import Server, admin_creds, bootstrap

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Stack:
    nginx: Nginx
    keysvc: Server
    keysvc_db: Path
    upstream: Upstream
    admin: Creds

    def get(self, path: str, creds: Creds | None = None, **headers: str) -> Answer:
        """A request through nginx, from the client's address."""
        sent = {**(creds.headers if creds else {}), **headers}
        return call(self.nginx.port, path, headers=sent, source=CLIENT)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """keysvc's API directly, as the admin; the answer's result."""
        return admin_api(self.keysvc.port, self.admin, method, path, body)

    def create_key(self, **fields: Any) -> Creds:
        return create_key(self.keysvc.port, self.admin, **fields)

    def refused(self, path: str, creds: Creds | None, status: int) -> Answer:
        """Refused with ``status`` by nginx, and the upstream never saw the request."""
        hits = len(self.upstream.seen)
        answer = self.get(path, creds)
        assert answer.status == status, (answer.status, answer.body, self.nginx.log()[-2000:])
        assert len(self.upstream.seen) == hits, self.upstream.seen[hits:]
        return answer

    def passed(self, path: str, creds: Creds) -> dict[str, Any]:
        """Let through to the upstream; what the upstream received."""
        hits = len(self.upstream.seen)
        answer = self.get(path, creds)
        assert answer.status == 200, (answer.status, answer.body, self.nginx.log()[-2000:])
        assert len(self.upstream.seen) == hits + 1
        received: dict[str, Any] = answer.json()
        assert received == self.upstream.seen[-1]
        return received


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = nginx_binary()
    directory = tmp_path_factory.mktemp("nginx")
    db = directory / "keysvc.db"
    created = bootstrap(db)
    admin = Creds(created["organizationId"], created["id"], created["keyId"], created["keySecret"])
    # keysvc believes nginx's X-Forwarded-For on its socket, and no TCP peer's; no
    # default rate limit, only a key's own. No answer may be reused: each request here
    # checks keysvc's own answer, and nginx's cache keeps none that says 0 (the reuse
    # bound through this same config: tests/system/test_nginx_reuse.py).
    env = {
        "KEYSVC_TRUSTED_PROXIES": "",
        "KEYSVC_RATE_LIMIT": "off",
        "KEYSVC_VERIFY_REUSE_SECONDS": "0",
    }
    socket_path = directory / "keysvc.sock"
    with ExitStack() as resources:
        upstream = Upstream()
        resources.callback(upstream.stop)
        keysvc = resources.enter_context(Server(db, env=env, unix=socket_path))
        nginx = Nginx(binary, directory, socket_path, upstream.base, admin.organization_id)
        nginx.test_config()
        resources.callback(nginx.stop)
        nginx.start()
        yield Stack(nginx, keysvc, db, upstream, admin)


def test_nginx_accepts_the_documented_config(tmp_path: Path) -> None:
    nginx = Nginx(nginx_binary(), tmp_path, tmp_path / "keysvc.sock", "http://127.0.0.1:9")
    output = nginx.test_config()
    assert "syntax is ok" in output
    assert "[warn]" not in output and "[emerg]" not in output, output


def test_a_valid_key_reaches_the_upstream_with_its_identity(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    # A client's own identity headers are refused: tests/system/test_nginx_hostile.py.
    answer = stack.get("/orders/42?page=2", developer)
    assert answer.status == 200, answer.body
    received = answer.json()
    assert received["path"] == "/orders/42?page=2"
    headers = received["headers"]
    assert headers["X-Key-Id"] == developer.id
    assert headers["X-Organization-Id"] == stack.admin.organization_id
    assert headers["X-Key-Permissions"] == "keys:read,roles:read"
    assert "Authorization" not in headers  # the key's secret stays with nginx and keysvc
    # Without a rate limit keysvc sends no X-RateLimit headers, nor does nginx.
    assert answer.headers["X-RateLimit-Limit"] is None

    # The request body still reaches the upstream (only the auth subrequest drops it).
    hits = len(stack.upstream.seen)
    posted = call(
        stack.nginx.port,
        "/orders",
        method="POST",
        headers=developer.headers,
        body={"item": "tea"},
        source=CLIENT,
    )
    assert posted.status == 200, posted.body
    assert len(stack.upstream.seen) == hits + 1
    assert posted.json()["method"] == "POST"
    assert json.loads(posted.json()["body"]) == {"item": "tea"}


def test_the_permission_location_lets_only_keys_holding_it_through(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    stack.refused("/reports/monthly", developer, 403)
    assert stack.passed("/orders", developer)["headers"]["X-Key-Id"] == developer.id
    received = stack.passed("/reports/monthly", stack.admin)
    assert received["path"] == "/reports/monthly"
    assert received["headers"]["X-Key-Id"] == stack.admin.id
    assert received["headers"]["X-Key-Permissions"] == "*"


def test_missing_unknown_and_wrong_credentials_are_401(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    answer = stack.refused("/orders", None, 401)
    assert answer.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'
    unknown = Creds(stack.admin.organization_id, "", "no-such-key", "keysvc_nope")
    stack.refused("/orders", unknown, 401)
    wrong = Creds(developer.organization_id, developer.id, developer.key_id, "wrong-secret")
    stack.refused("/reports/monthly", wrong, 401)


def test_a_key_created_disabled_is_401(stack: Stack) -> None:
    disabled = stack.create_key(roles=["admin"], state="disabled")
    stack.refused("/orders", disabled, 401)
    stack.refused("/reports/monthly", disabled, 401)


def test_keysvc_sees_the_client_address_nginx_forwards(stack: Stack) -> None:
    # nginx itself reaches keysvc from 127.0.0.1; the client is 127.0.0.2.
    nginx_only = stack.create_key(roles=["developer"], ipAccessList=[{"source": "127.0.0.1/32"}])
    stack.refused("/orders", nginx_only, 403)
    client_only = stack.create_key(roles=["developer"], ipAccessList=[{"source": CLIENT}])
    assert stack.passed("/orders", client_only)["headers"]["X-Key-Id"] == client_only.id


def test_a_rate_limited_key_gets_429_with_retry_after(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], rateLimit={"limit": 2, "windowSeconds": 60})
    for remaining in ("1", "0"):
        answer = stack.get("/orders", limited)
        assert answer.status == 200, answer.body
        assert answer.headers["X-RateLimit-Limit"] == "2"
        assert answer.headers["X-RateLimit-Remaining"] == remaining
    hits = len(stack.upstream.seen)
    answer = stack.refused("/orders", limited, 429)
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json()["status"] == 429
    retry_after = answer.headers["Retry-After"]
    assert retry_after is not None and 0 < int(retry_after) <= 60
    assert len(stack.upstream.seen) == hits
    # Other keys are not affected.
    stack.passed("/orders", stack.admin)


def test_a_key_disabled_through_the_api_is_refused_on_the_next_request(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    stack.passed("/orders", key)
    assert stack.api("PATCH", f"/keys/{key.id}", {"state": "disabled"})["state"] == "disabled"
    stack.refused("/orders", key, 401)
    stack.api("PATCH", f"/keys/{key.id}", {"state": "enabled"})
    stack.passed("/orders", key)


def test_nginx_fails_closed_when_keysvc_is_unreachable(stack: Stack, tmp_path: Path) -> None:
    # Nothing listens on this socket: the auth subrequest fails, and so does the request.
    nowhere = tmp_path / "nobody.sock"
    nginx = Nginx(
        nginx_binary(), tmp_path, nowhere, stack.upstream.base, stack.admin.organization_id
    )
    try:
        nginx.start()
        hits = len(stack.upstream.seen)
        answer = call(nginx.port, "/orders", headers=stack.admin.headers, source=CLIENT)
        # 503 with a retry signal (keysvc stopped or restarting), never a 500.
        assert answer.status == 503, answer.body
        assert answer.headers["Retry-After"] == "5"
        body = answer.json()
        assert UUID4.match(body.pop("requestId")) and body == {
            "status": 503,
            "error": "authorization unavailable: try again later",
        }
        assert len(stack.upstream.seen) == hits
    finally:
        nginx.stop()


# Spellings of a /reports/ path that an upstream may serve as /reports/... (case,
# path parameters, backslashes, dot segments, encodings of each) but that a
# case-sensitive prefix location and the raw URI let through unchecked.
REPORT_VARIANTS = [
    "/Reports/q1",
    "/REPORTS/q1",
    "/reports;a/q1",
    "/reports%3Ba/q1",
    "/reports%3ba/q1",
    "/reports\\q1",
    "/reports%5Cq1",
    "/reports%255Cq1",
    "/reports%253Bq1",
    "/reports/../x",
    "/x/../reports/q1",
    "/reports/%2e%2e/x",
    "/reports/.%2E/x",
    "/reports%2F..%2Fx",
    "/./reports/q1",
    "/reports/./q1",
    "//reports/q1",
    "/%72eports/q1",
    "/reports%2Fq1",
    "/reports%0d%0aX-Key-Id:%20forged/q1",
]


@pytest.mark.parametrize("path", REPORT_VARIANTS)
def test_every_spelling_of_a_protected_path_is_refused_or_checked(stack: Stack, path: str) -> None:
    developer = stack.create_key(roles=["developer"])  # no reports:read
    hits = len(stack.upstream.seen)
    answer = stack.get(path, developer)
    assert answer.status in (400, 403), (answer.status, answer.body)
    assert len(stack.upstream.seen) == hits, stack.upstream.seen[hits:]


# Paths an upstream may route to /reports' handler (a format suffix, encoded or not;
# an encoded space, "?" or overlong "/"), which a prefix ending at "/" or the path's end
# would leave unchecked.
@pytest.mark.parametrize(
    "path", ["/reports.json", "/reports%2ejson", "/reports%20", "/reports%3f", "/reports%C0%AFx"]
)
def test_a_path_that_only_starts_with_a_protected_prefix_is_checked(
    stack: Stack, path: str
) -> None:
    developer = stack.create_key(roles=["developer"])  # no reports:read
    stack.refused(path, developer, 403)
    assert stack.passed(path, stack.admin)["raw_path"].lower().startswith("/reports")


def test_a_refused_path_is_a_json_400(stack: Stack) -> None:
    answer = stack.refused("/reports;a/q1", stack.admin, 400)
    assert answer.headers["Content-Type"] == "application/json"
    error = (
        "bad request: send the path without ; \\ % or . and .. segments, and no | in Authorization"
    )
    body = answer.json()
    assert body.pop("requestId") and body == {"status": 400, "error": error}


@pytest.mark.parametrize(
    ("path", "forwarded"),
    [
        ("/Reports/q1", "/Reports/q1"),
        ("//reports//q1", "/reports/q1"),
        ("/%72eports/q1", "/reports/q1"),
        ("/reports%2Fq1", "/reports/q1"),
        ("/reports/a%20b?x=%2e%2e", "/reports/a%20b?x=%2e%2e"),
    ],
)
def test_a_checked_path_reaches_the_upstream_as_nginx_matched_it(
    stack: Stack, path: str, forwarded: str
) -> None:
    received = stack.passed(path, stack.admin)
    assert received["raw_path"] == forwarded
    assert received["headers"]["X-Key-Id"] == stack.admin.id


def test_keys_of_another_organization_are_refused(stack: Stack) -> None:
    # Its admin holds every permission, reports:read included, but not this organization.
    other = admin_creds(bootstrap(stack.keysvc_db, "--org-name", "other"))
    stack.refused("/orders", other, 403)
    stack.refused("/reports/q1", other, 403)
    stack.passed("/reports/q1", stack.admin)


def test_a_key_with_a_long_permission_list_still_passes(stack: Stack) -> None:
    granted = sorted(f"svc{n:02d}:{'a' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": "wide", "permissions": granted})
    wide = stack.create_key(assignedRoleIds=[role["id"]])
    shown = stack.passed("/orders", wide)["headers"]["X-Key-Permissions"]
    *kept, rest = shown.split(",")
    assert kept == granted[: len(kept)]
    assert rest == f"+{len(granted) - len(kept)} more"


def test_a_local_process_cannot_forge_its_address_to_keysvc(stack: Stack) -> None:
    # The key is allowed from the client's address only; a process on this machine that
    # calls keysvc's TCP port directly with that address forged is not believed.
    client_only = stack.create_key(roles=["developer"], ipAccessList=[{"source": CLIENT}])
    stack.passed("/orders", client_only)
    forged = {**client_only.headers, "X-Forwarded-For": CLIENT}
    answer = call(stack.keysvc.port, "/v1/verify", headers=forged)
    assert answer.status == 403, answer.body
    assert answer.json()["error"] == "client address not allowed for this key"


@pytest.mark.parametrize(
    ("granted", "allowed"),
    [
        (["reports:read", "region:eu"], True),
        (["reports:read", "region:any"], True),
        (["reports:read"], False),
        (["region:eu", "region:any"], False),
    ],
)
def test_the_shipped_map_s_permission_query_is_met_through_nginx(
    stack: Stack, granted: list[str], allowed: bool
) -> None:
    """The config's example: /reports/eu needs reports:read AND (region:eu OR region:any)."""
    name = "q-" + "-".join(g.replace(":", ".") for g in granted)
    role = stack.api("POST", "/roles", {"name": name, "permissions": granted})
    key = stack.create_key(assignedRoleIds=[role["id"]])
    if allowed:
        stack.passed("/reports/eu/q1", key)
    else:
        stack.refused("/reports/eu/q1", key, 403)
    if "reports:read" in granted:  # the plain prefix needs the one name
        stack.passed("/reports/q1", key)
