"""keysvc as the authority behind a real Caddy's forward_auth, all real processes.

docs/Caddyfile, the configuration docs/forward-auth/caddy.md shows, is run as it is by a real Caddy
(Debian's package: tests/components.py) in front of the tiny aiohttp upstream that
echoes the headers it receives, with a real `keysvc serve` deciding, reached over its
unix socket. Everything else listens on loopback. The client connects from 127.0.0.2,
so keysvc can only learn that address from Caddy's X-Forwarded-For, which it believes
on the socket alone. Every refusal is also checked to never reach the upstream. The
hostile client's tests: tests/system/test_caddy_hostile.py.
"""

import json
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.caddy import CADDYFILE, ENV, Caddy, Stack, caddy_binary, start_stack
from tests.helpers import Creds
from tests.nginx import CLIENT, call
from tests.server import admin_creds, bootstrap


def without_request_id(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope but its requestId (test_caddy_hostile.py checks those)."""
    return {name: value for name, value in envelope.items() if name != "requestId"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The reuse bound at its default (1 s): Caddy keeps no answer, whatever keysvc says.
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("caddy"), ENV)


def test_caddy_accepts_the_documented_config_as_formatted(tmp_path: Path) -> None:
    caddy = Caddy(caddy_binary(), tmp_path, tmp_path / "keysvc.sock", "127.0.0.1:9", "x")
    output = caddy.validate()
    assert "Valid configuration" in output, output
    assert '"level":"warn"' not in output and '"level":"error"' not in output, output
    formatted = subprocess.run(
        [caddy.binary, "fmt", str(CADDYFILE)], capture_output=True, timeout=30, check=True
    )
    assert formatted.stdout == CADDYFILE.read_bytes()


def test_the_caddy_page_includes_the_caddyfile_that_is_tested() -> None:
    """docs/forward-auth/caddy.md shows docs/Caddyfile itself, included at build time
    (tests/system/test_docs_site.py checks the built page); the README holds no copy."""
    page = CADDYFILE.parent / "forward-auth" / "caddy.md"
    shown = re.findall(r"```caddyfile\n(.*?)```", page.read_text(), re.S)
    assert shown == ['--8<-- "docs/Caddyfile"\n']
    assert "```caddyfile" not in (CADDYFILE.parents[1] / "README.md").read_text()


def test_a_valid_key_reaches_the_upstream_with_its_identity(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    answer = stack.get("/orders/42?page=2", developer)
    assert answer.status == 200, answer.body
    received = answer.json()
    assert received["path"] == "/orders/42?page=2"
    headers = received["headers"]
    assert headers["X-Key-Id"] == developer.id
    assert headers["X-Organization-Id"] == stack.admin.organization_id
    assert headers["X-Key-Permissions"] == "keys:read,roles:read"
    assert "Authorization" not in headers  # the key's secret stays with Caddy and keysvc
    # Without a rate limit keysvc sends no X-RateLimit headers, nor does Caddy.
    assert answer.headers["X-RateLimit-Limit"] is None
    # keysvc gave neither: the upstream gets neither, not Caddy's placeholder's name.
    assert "X-Key-External-Id" not in headers and "X-Credits-Remaining" not in headers

    # The request body still reaches the upstream (only keysvc's request drops it).
    hits = len(stack.upstream.seen)
    posted = call(
        stack.caddy.port,
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


def test_the_permission_map_lets_only_keys_holding_it_through(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    answer = stack.refused("/reports/monthly", developer, 403)
    assert answer.json()["error"] == "this key lacks the permission reports:read"
    assert stack.passed("/orders", developer)["headers"]["X-Key-Id"] == developer.id
    received = stack.passed("/reports/monthly", stack.admin)
    assert received["path"] == "/reports/monthly"
    assert received["headers"]["X-Key-Id"] == stack.admin.id
    assert received["headers"]["X-Key-Permissions"] == "*"


@pytest.mark.parametrize(
    ("granted", "allowed"),
    [
        (["reports:read", "region:eu"], True),
        (["reports:read", "region:any"], True),
        (["reports:read"], False),
        (["region:eu", "region:any"], False),
    ],
)
def test_the_shipped_map_s_permission_query_is_met_through_caddy(
    stack: Stack, granted: list[str], allowed: bool
) -> None:
    """The config's example: /reports/eu needs reports:read AND (region:eu OR region:any)."""
    name = "q-" + "-".join(g.replace(":", ".") for g in granted)
    role = stack.api("POST", "/roles", {"name": name, "permissions": granted})
    key = stack.create_key(assignedRoleIds=[role["id"]])
    if allowed:
        stack.passed("/reports/eu/q1", key)
        stack.passed("/REPORTS/EU/q1", key)
    else:
        stack.refused("/reports/eu/q1", key, 403)
        stack.refused("/Reports/Eu/q1", key, 403)
    if "reports:read" in granted:  # the plain prefix needs the one name
        stack.passed("/reports/q1", key)


def test_missing_unknown_and_wrong_credentials_are_keysvc_s_401(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])
    answer = stack.refused("/orders", None, 401)
    assert answer.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'
    body = answer.json()
    assert body["status"] == 401 and body["requestId"] == answer.headers["X-Request-Id"]
    unknown = Creds(stack.admin.organization_id, "", "no-such-key", "keysvc_nope")
    stack.refused("/orders", unknown, 401)
    wrong = Creds(developer.organization_id, developer.id, developer.key_id, "wrong-secret")
    stack.refused("/reports/monthly", wrong, 401)


def test_a_key_created_disabled_is_401(stack: Stack) -> None:
    disabled = stack.create_key(roles=["admin"], state="disabled")
    stack.refused("/orders", disabled, 401)
    stack.refused("/reports/monthly", disabled, 401)


def test_keys_of_another_organization_are_refused(stack: Stack) -> None:
    # Its admin holds every permission, reports:read included, but not this organization.
    other = admin_creds(bootstrap(stack.keysvc_db, "--org-name", "other"))
    answer = stack.refused("/orders", other, 403)
    assert "organization" in answer.json()["error"]
    stack.refused("/reports/q1", other, 403)
    stack.passed("/reports/q1", stack.admin)


def test_keysvc_sees_the_client_address_caddy_forwards(stack: Stack) -> None:
    # Caddy itself reaches keysvc over the socket; the client is 127.0.0.2.
    local_only = stack.create_key(roles=["developer"], ipAccessList=[{"source": "127.0.0.1/32"}])
    stack.refused("/orders", local_only, 403)
    client_only = stack.create_key(roles=["developer"], ipAccessList=[{"source": CLIENT}])
    assert stack.passed("/orders", client_only)["headers"]["X-Key-Id"] == client_only.id


def test_a_rate_limited_key_gets_keysvc_s_429_with_retry_after(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], rateLimit={"limit": 2, "windowSeconds": 60})
    for remaining in ("1", "0"):
        answer = stack.get("/orders", limited)
        assert answer.status == 200, answer.body
        assert answer.headers["X-RateLimit-Limit"] == "2"
        assert answer.headers["X-RateLimit-Remaining"] == remaining
        assert 0 <= int(answer.headers["X-RateLimit-Reset"]) <= 60
        # The upstream's own answer, not keysvc's, is the client's.
        assert answer.json()["headers"]["X-Key-Id"] == limited.id
    answer = stack.refused("/orders", limited, 429)
    assert answer.json()["status"] == 429
    retry_after = answer.headers["Retry-After"]
    assert retry_after is not None and 0 < int(retry_after) <= 60
    stack.passed("/orders", stack.admin)  # other keys are not affected


def test_a_disabled_key_is_refused_on_its_next_request_caddy_keeps_no_answer(
    stack: Stack,
) -> None:
    """keysvc lets a proxy reuse an answer for 1 s here; Caddy keeps none: every request
    is keysvc's to answer, and a key disabled is refused on its very next one."""
    key = stack.create_key(roles=["developer"])
    for _ in range(3):
        before = stack.verified()
        for _ in range(3):
            stack.passed("/orders", key)
        assert stack.verified() == before + 3
        assert stack.api("PATCH", f"/keys/{key.id}", {"state": "disabled"})["state"] == "disabled"
        disabled_at = time.monotonic()
        stack.refused("/orders", key, 401)
        assert time.monotonic() - disabled_at < 1  # well within keysvc's stated bound
        stack.api("PATCH", f"/keys/{key.id}", {"state": "enabled"})
        stack.passed("/orders", key)


def test_a_key_deleted_is_refused_on_its_next_request(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    stack.passed("/orders", key)
    hits = len(stack.upstream.seen)
    stack.api("DELETE", f"/keys/{key.id}")
    stack.refused("/orders", key, 401)
    assert len(stack.upstream.seen) == hits


def test_a_permission_taken_from_a_key_s_role_is_refused_on_its_next_request(
    stack: Stack,
) -> None:
    role = stack.api("POST", "/roles", {"name": "narrowed", "permissions": ["reports:read"]})
    key = stack.create_key(assignedRoleIds=[role["id"]])
    stack.passed("/reports/q1", key)
    stack.api("PATCH", f"/roles/{role['id']}", {"permissions": ["keys:read"]})
    stack.refused("/reports/q1", key, 403)
    stack.passed("/orders", key)


def test_caddy_fails_closed_when_keysvc_is_unreachable(stack: Stack, tmp_path: Path) -> None:
    # Nothing listens on this socket: keysvc's request fails, and so does the request.
    nowhere = tmp_path / "nobody.sock"
    caddy = Caddy(
        caddy_binary(), tmp_path, nowhere, stack.upstream.base, stack.admin.organization_id
    )
    try:
        caddy.start()
        hits = len(stack.upstream.seen)
        answer = call(caddy.port, "/orders", headers=stack.admin.headers, source=CLIENT)
        # 503 with a retry signal (keysvc stopped or restarting), not a 502 (rt40 N3).
        assert answer.status == 503, answer.body
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.headers["Retry-After"] == "5"
        assert without_request_id(answer.json()) == {
            "status": 503,
            "error": "authorization unavailable: try again later",
        }
        assert len(stack.upstream.seen) == hits
    finally:
        caddy.stop()


def test_an_empty_organization_setting_lets_no_key_through(tmp_path: Path) -> None:
    """KEYSVC_ORGANIZATION unset: keysvc is asked for an organization it cannot match
    (a 400), never for none."""
    with ExitStack() as resources:
        stack = start_stack(resources, tmp_path)
        stack.caddy.stop()
        stack.caddy.env["KEYSVC_ORGANIZATION"] = ""
        stack.caddy.start()
        answer = stack.refused("/orders", stack.admin, 400)
        assert answer.json()["error"].startswith("organization: must be an organization ID")


ERROR_400 = (
    "bad request: send the path without ; \\ % or empty, . and .. segments,"
    " and no X-Key-*, X-Credits-* or X-Organization-Id header"
)


# Spellings of a /reports/ path that an upstream may serve as /reports/... (case,
# path parameters, backslashes, dot and empty segments, encodings of each): each is
# refused before any check (400) or checked as /reports (403 for a key without
# reports:read), never let through unchecked.
@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/Reports/q1", 403),
        ("/REPORTS/q1", 403),
        ("/%72eports/q1", 403),
        ("/reports%2Fq1", 403),
        ("/reports;a/q1", 400),
        ("/reports%3Ba/q1", 400),
        ("/reports%3ba/q1", 400),
        ("/reports\\q1", 400),
        ("/reports%5Cq1", 400),
        ("/reports%255Cq1", 400),
        ("/reports%253Bq1", 400),
        ("/reports/../x", 400),
        ("/x/../reports/q1", 400),
        ("/reports/%2e%2e/x", 400),
        ("/reports/.%2E/x", 400),
        ("/reports%2F..%2Fx", 400),
        ("/./reports/q1", 400),
        ("/reports/./q1", 400),
        ("//reports/q1", 400),
        ("/%2Freports/q1", 400),
        ("/reports%0d%0aX-Key-Id:%20forged/q1", 400),
    ],
)
def test_every_spelling_of_a_protected_path_is_refused_or_checked(
    stack: Stack, path: str, status: int
) -> None:
    developer = stack.create_key(roles=["developer"])  # no reports:read
    before = stack.verified()
    answer = stack.refused(path, developer, status)
    if status == 400:
        assert answer.headers["Content-Type"] == "application/json"
        assert without_request_id(answer.json()) == {"status": 400, "error": ERROR_400}
        assert stack.verified() == before  # refused before keysvc is asked


# Paths an upstream may route to /reports' handler (a format suffix, encoded or not;
# an encoded space, "?" or overlong "/").
@pytest.mark.parametrize(
    "path", ["/reports.json", "/reports%2ejson", "/reports%20", "/reports%3f", "/reports%C0%AFx"]
)
def test_a_path_that_only_starts_with_a_protected_prefix_is_checked(
    stack: Stack, path: str
) -> None:
    developer = stack.create_key(roles=["developer"])  # no reports:read
    stack.refused(path, developer, 403)
    assert stack.passed(path, stack.admin)["raw_path"] == path


@pytest.mark.parametrize(
    "path", ["/Reports/q1", "/%72eports/q1", "/reports%2Fq1", "/reports/a%20b?x=%2e%2e"]
)
def test_a_checked_path_reaches_the_upstream_as_sent(stack: Stack, path: str) -> None:
    received = stack.passed(path, stack.admin)
    assert received["raw_path"] == path
    assert received["headers"]["X-Key-Id"] == stack.admin.id


def test_a_key_with_a_long_permission_list_still_passes(stack: Stack) -> None:
    granted = sorted(f"svc{n:02d}:{'a' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": "wide", "permissions": granted})
    wide = stack.create_key(assignedRoleIds=[role["id"]])
    shown = stack.passed("/orders", wide)["headers"]["X-Key-Permissions"]
    *kept, rest = shown.split(",")
    assert kept == granted[: len(kept)]
    assert rest == f"+{len(granted) - len(kept)} more"
