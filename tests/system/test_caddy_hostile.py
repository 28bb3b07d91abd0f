"""A hostile client of the shipped docs/Caddyfile, through a real Caddy in front of a
real `keysvc serve` that would let a proxy reuse its answers (the default 1 s): a client
with a valid key of its own sends every header keysvc reads or answers with, and the
query parameters keysvc reads, with empty, wildcard and non-ASCII values. Caddy's
forward_auth passes the client's headers on to keysvc unless told otherwise: none of
them may change keysvc's decision or the cost it spends, and the upstream hears who
called from keysvc alone.
"""

import http.client
import json
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from socket import create_connection
from typing import Any
from urllib.parse import unquote

import pytest

from keysvc.http.reuse import VARY
from keysvc.http.schemas import UUID_PATTERN
from tests.caddy import Caddy, Stack, caddy_binary, start_stack
from tests.nginx import CLIENT, call, raw

OTHER_ORGANIZATION = "0e4f6b5a-1c2d-4e3f-8a9b-0c1d2e3f4a5b"
# The names keysvc answers with, which the upstream may get from keysvc alone: refused.
KEYSVC_ANSWERS = (
    "X-Key-Id",
    "X-Organization-Id",
    "X-Key-Permissions",
    "X-Key-External-Id",
    "X-Credits-Remaining",
)
# Values each is sent with: a wildcard, empty, the separator, non-ASCII (Latin-1 bytes).
HOSTILE_VALUES = ("*", "", "a|b|c", "caf\u00e9 \u00ff")
# Every request header a verify answer depends on (keysvc's own list, keysvc.http.reuse),
# but the credentials, as a client would send them to weaken the check.
KEYSVC_READS = {
    "X-Required-Permission": "",
    "X-Required-Organization": OTHER_ORGANIZATION,
    "X-Credit-Cost": "0",
    "X-Ratelimit": "unknown",
    "X-Forwarded-For": "10.9.9.9",
    "Accept": "application/json",
}
REFUSED = (
    "bad request: send the path without ; \\ % or empty, . and .. segments,"
    " and no X-Key-*, X-Credits-* or X-Organization-Id header"
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("caddy-hostile"))


def test_the_hostile_headers_cover_every_header_keysvc_s_answer_depends_on() -> None:
    depends_on = {name.strip() for name in VARY.split(",")}
    assert depends_on - {"Authorization"} == set(KEYSVC_READS)


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("name", [*KEYSVC_ANSWERS, "x-KEY-id", "x-credits-REMAINING"])
def test_a_header_only_keysvc_may_give_is_refused_before_any_check(
    stack: Stack, name: str, value: str
) -> None:
    key = stack.create_key(roles=["developer"])
    before = stack.verified()
    answer = call(stack.caddy.port, "/orders", headers={**key.headers, name: value}, source=CLIENT)
    assert answer.status == 400, answer.body
    assert answer.json()["error"] == REFUSED
    assert stack.verified() == before  # keysvc never asked
    assert not [seen for seen in stack.upstream.seen if seen["headers"].get(name) == value]


@pytest.mark.parametrize("name", ["X-Key-Anything-Later", "X-Credits-Spent", "x-key-ROLE"])
def test_any_other_header_of_keysvc_s_families_is_removed(stack: Stack, name: str) -> None:
    """Caddy can refuse named headers only, not every name of a family: the rest of
    X-Key-* and X-Credits-* never reach the upstream."""
    key = stack.create_key(roles=["developer"])
    assert stack.through("/orders", {**key.headers, name: "forged"}) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert "forged" not in received.values()
    assert received["X-Key-Id"] == key.id


@pytest.mark.parametrize("named", ["X-Key-Id", "x-key-permissions", "close, X-Organization-Id"])
def test_a_connection_header_naming_keysvc_s_headers_is_refused(stack: Stack, named: str) -> None:
    """Caddy drops the headers a request's Connection names, keysvc's answer's too."""
    key = stack.create_key(roles=["developer"])
    before = stack.verified()
    assert stack.through("/orders", {**key.headers, "Connection": named}) == (400, 0)
    assert stack.verified() == before


def test_a_connection_header_naming_keysvc_s_inputs_changes_nothing(stack: Stack) -> None:
    """Caddy drops what Connection names before it sets the config's own inputs."""
    named = {"Connection": ", ".join(KEYSVC_READS)}
    developer = stack.create_key(roles=["developer"])
    assert stack.through("/reports/q1", {**developer.headers, **named}) == (403, 0)
    limited = stack.create_key(roles=["developer"], ipAccessList=[{"source": "10.9.9.9/32"}])
    forged = {**limited.headers, **named, "X-Forwarded-For": "10.9.9.9"}
    assert stack.through("/orders", forged) == (403, 0)
    paying = stack.create_key(roles=["developer"], credits={"remaining": 5, "refill": None})
    for _ in range(2):
        sent = {**paying.headers, **named, "X-Credit-Cost": "0"}
        assert stack.through("/orders", sent) == (200, 1)
    assert stack.remaining(paying) == 3


def test_headers_keysvc_reads_never_weaken_its_check(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], ipAccessList=[{"source": "10.9.9.9/32"}])
    # Its address is 127.0.0.2 whatever X-Forwarded-For says: refused.
    assert stack.through("/orders", {**limited.headers, **KEYSVC_READS}) == (403, 0)
    key = stack.create_key(roles=["developer"])
    # Another organization required, a JSON answer asked for: neither reaches keysvc.
    assert stack.through("/orders", {**key.headers, **KEYSVC_READS}) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert received["X-Key-Id"] == key.id
    assert received["X-Organization-Id"] == stack.admin.organization_id
    # A permission the path needs is not waived by an empty or a wildcard requirement.
    for value in ("", "*", "orders:read", "keys:read OR reports:read"):
        sent = {**key.headers, **KEYSVC_READS, "X-Required-Permission": value}
        assert stack.through("/reports/q1", sent) == (403, 0)


@pytest.mark.parametrize(
    "query",
    [
        "permission=",
        "permission=keys:read",
        f"organization={OTHER_ORGANIZATION}",
        "organization=",
        "cost=0",
        "cost=abc",
    ],
)
def test_the_client_s_query_never_reaches_keysvc(stack: Stack, query: str) -> None:
    """keysvc reads requirements from the query too: Caddy asks with the config's own
    query, so a client's neither weakens the check nor fails it; the upstream gets the
    query as sent."""
    key = stack.create_key(roles=["developer"])  # keys:read, no reports:read
    assert stack.through(f"/reports/q1?{query}", key.headers) == (403, 0)
    assert stack.through(f"/orders?{query}", key.headers) == (200, 1)
    assert stack.upstream.seen[-1]["path"] == f"/orders?{query}"


@pytest.mark.parametrize("cost", ["0", "abc", "-1", "", "1000000"])
@pytest.mark.parametrize("query", ["", "?cost=0"])
def test_credits_are_spent_at_the_config_s_cost_whatever_the_client_says(
    stack: Stack, cost: str, query: str
) -> None:
    key = stack.create_key(roles=["developer"], credits={"remaining": 5, "refill": None})
    headers = {**key.headers, "X-Credit-Cost": cost}
    statuses = [stack.through(f"/orders{query}", headers)[0] for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    assert stack.remaining(key) == 0
    # What reached the upstream came from keysvc's answer.
    assert stack.upstream.seen[-1]["headers"]["X-Credits-Remaining"] == "0"


def test_a_key_with_credits_is_charged_on_every_request(stack: Stack) -> None:
    """No answer is reused: each request through Caddy is one verify, one credit."""
    key = stack.create_key(roles=["developer"], credits={"remaining": 50, "refill": None})
    before = stack.verified()
    for _ in range(10):
        assert stack.through("/orders", key.headers) == (200, 1)
    assert stack.verified() == before + 10
    assert stack.remaining(key) == 40


def test_the_upstream_gets_keysvc_s_external_id_and_credits_alone(stack: Stack) -> None:
    external = "M\u00fcller 50% \U0001d11e"
    key = stack.create_key(roles=["developer"], externalId=external, credits={"remaining": 9})
    assert stack.through("/orders", key.headers) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert received["X-Key-External-Id"] == "M%C3%BCller 50%25 %F0%9D%84%9E"
    assert unquote(received["X-Key-External-Id"]) == external
    assert received["X-Credits-Remaining"] == "8"
    # A key without either: the upstream gets neither header.
    plain = stack.create_key(roles=["developer"])
    assert stack.through("/orders", plain.headers) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert "X-Key-External-Id" not in received and "X-Credits-Remaining" not in received


def test_an_external_id_spelled_as_caddy_s_placeholder_still_reaches_the_upstream(
    stack: Stack,
) -> None:
    external = "{http.reverse_proxy.header.X-Key-External-Id}"
    key = stack.create_key(roles=["developer"], externalId=external)
    assert stack.through("/orders", key.headers) == (200, 1)
    assert stack.upstream.seen[-1]["headers"]["X-Key-External-Id"] == external


def test_the_largest_answer_headers_pass(stack: Stack) -> None:
    # keysvc's largest: a full X-Key-Permissions (3,072 characters) and an externalId of
    # 255 four-byte characters, 3,060 characters percent-encoded.
    granted = sorted(f"svc{n:02d}:{'c' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": "widest", "permissions": granted})
    external = "\U0001d11e" * 255
    key = stack.create_key(assignedRoleIds=[role["id"]], externalId=external)
    assert stack.through("/orders", key.headers) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert len(received["X-Key-Permissions"]) > 3000
    assert len(received["X-Key-External-Id"]) == 3060
    assert unquote(received["X-Key-External-Id"]) == external


@pytest.mark.parametrize("control", ["\x01", "\x7f", "\x1f"])
def test_credentials_with_a_control_character_are_a_400_never_a_500(
    stack: Stack, control: str
) -> None:
    key = stack.create_key(roles=["developer"])
    hits = len(stack.upstream.seen)
    authorization = key.headers["Authorization"] + control
    head = (
        "GET /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Authorization: {authorization}\r\n\r\n"
    )
    status, body = raw(stack.caddy.port, head.encode())
    assert status == 400, body
    assert len(stack.upstream.seen) == hits


@pytest.mark.parametrize("query", ["a=\x01", "a=\x7f", "\x00", "a=\x1b"])
@pytest.mark.parametrize("with_key", [True, False])
def test_a_control_character_in_the_query_is_a_400_never_a_500(
    stack: Stack, query: str, with_key: bool
) -> None:
    key = stack.create_key(roles=["developer"])
    hits = len(stack.upstream.seen)
    authorization = f"Authorization: {key.headers['Authorization']}\r\n" if with_key else ""
    head = (
        f"GET /orders?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"{authorization}\r\n"
    )
    status, body = raw(stack.caddy.port, head.encode())
    assert status == 400, body
    assert len(stack.upstream.seen) == hits


def test_a_json_accept_still_gets_the_upstream_s_answer(stack: Stack) -> None:
    """keysvc's JSON answer is for a caller of verify, not for the client behind Caddy."""
    key = stack.create_key(roles=["developer"])
    answer = call(
        stack.caddy.port,
        "/orders",
        headers={**key.headers, "Accept": "application/json"},
        source=CLIENT,
    )
    assert answer.status == 200
    assert json.loads(answer.body)["headers"]["X-Key-Id"] == key.id


# keysvc's answer headers as a CGI-style server names them (PEP 3333's HTTP_*, PHP's
# FastCGI, Rack): "-" and "_" fold into one, case is lost.
KEYSVC_FAMILIES = ("HTTP_X_KEY_", "HTTP_X_CREDITS_", "HTTP_X_ORGANIZATION_ID")


def cgi_view(headers: dict[str, str]) -> dict[str, list[str]]:
    """What a CGI-style upstream reads of keysvc's headers: every value under each
    folded name (Python's wsgiref joins them with ","; Caddy's FastCGI keeps one)."""
    folded: dict[str, list[str]] = {}
    for name, value in headers.items():
        key = "HTTP_" + name.upper().replace("-", "_")
        if key.startswith(KEYSVC_FAMILIES):
            folded.setdefault(key, []).append(value)
    return folded


@pytest.mark.parametrize(
    "spelling",
    [
        lambda name: name.replace("-", "_"),
        lambda name: name.replace("-", "_", 1),
        lambda name: name[::-1].replace("-", "_", 1)[::-1],
        lambda name: name.lower().replace("-", "_"),
    ],
    ids=["all", "first", "last", "lower"],
)
def test_keysvc_s_headers_spelled_with_underscores_never_reach_the_upstream(
    stack: Stack, spelling: Any
) -> None:
    """Caddy passes a header named X_Key_Permissions as it is; an upstream that reads
    headers as CGI variables takes it for keysvc's X-Key-Permissions (a permission
    added to the key's), and X_Key_External_Id or X_Credits_Remaining for the ones
    keysvc left out. The upstream reads keysvc's answer and nothing else."""
    key = stack.create_key(roles=["developer"])  # no externalId, no credits
    forged = {
        "X-Key-Permissions": "reports:read",
        "X-Key-External-Id": "acme-corp",
        "X-Organization-Id": OTHER_ORGANIZATION,
        "X-Credits-Remaining": "1000000",
        "X-Key-Id": "someone-else",
        "X-Key-Role": "admin",
    }
    sent = {**key.headers, **{spelling(name): value for name, value in forged.items()}}
    assert stack.through("/orders", sent)[1] == 1
    assert cgi_view(stack.upstream.seen[-1]["headers"]) == {
        "HTTP_X_KEY_ID": [key.id],
        "HTTP_X_KEY_PERMISSIONS": ["keys:read,roles:read"],
        "HTTP_X_ORGANIZATION_ID": [stack.admin.organization_id],
    }


ADMIN_STARTED = re.compile(r'"msg":"admin endpoint started","address":"([^"]+)"')


def load_config(address: str, caddyfile: str) -> int:
    """POST a Caddyfile to Caddy's admin endpoint at ``address`` (host:port), as any
    local process can; the status."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", "/load", caddyfile, {"Content-Type": "text/caddyfile"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_no_local_process_can_reconfigure_caddy_by_the_file_s_own_settings(
    stack: Stack, tmp_path: Path
) -> None:
    """Caddy's admin API has no authentication: a process that reaches it loads a
    config without forward_auth. The file leaves it off unless CADDY_ADMIN names one."""
    organization = stack.admin.organization_id
    socket_path = stack.keysvc.unix
    assert socket_path is not None
    caddy = Caddy(caddy_binary(), tmp_path, socket_path, stack.upstream.base, organization)
    del caddy.env["CADDY_ADMIN"]  # the file's own default
    caddy.start()
    try:
        started = ADMIN_STARTED.search(caddy.log())
        if started is not None:
            site = f"http://127.0.0.1:{caddy.port} {{\n\treverse_proxy {stack.upstream.base}\n}}\n"
            assert load_config(started[1], site) != 200, "a local process replaced the config"
        answer = call(caddy.port, "/reports/q1", source=CLIENT)
        assert answer.status == 401, answer.body
    finally:
        caddy.stop()


def test_a_keysvc_that_does_not_answer_is_a_504_never_a_hang(tmp_path: Path) -> None:
    """A frozen keysvc (SIGSTOP): its socket still accepts, and Caddy would wait for
    ever. The client gets the config's JSON 504 within the bound, and the upstream
    nothing."""
    with ExitStack() as resources:
        stack = start_stack(resources, tmp_path)
        key = stack.create_key(roles=["developer"])
        stack.keysvc.proc.send_signal(signal.SIGSTOP)
        try:
            connection = http.client.HTTPConnection(
                "127.0.0.1", stack.caddy.port, timeout=60, source_address=(CLIENT, 0)
            )
            started = time.monotonic()
            try:
                connection.request("GET", "/orders", headers=key.headers)
                response = connection.getresponse()
                status, body = response.status, json.loads(response.read())
            except TimeoutError:
                status, body = 0, {}
            finally:
                connection.close()
            waited = time.monotonic() - started
        finally:
            stack.keysvc.proc.send_signal(signal.SIGCONT)
        assert (status, body.get("status")) == (504, 504), (status, body, waited)
        assert 19 < waited < 40
        assert stack.upstream.seen == []
        assert stack.through("/orders", key.headers) == (200, 1)  # and back once it answers


def test_a_client_that_never_finishes_its_headers_is_cut_off(stack: Stack) -> None:
    """No key needed to hold a connection open: Caddy closes it within the bound."""
    with create_connection(("127.0.0.1", stack.caddy.port), source_address=(CLIENT, 0)) as sock:
        sock.settimeout(60)
        sock.sendall(b"GET /orders HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        try:
            while sock.recv(4096):
                pass
        except TimeoutError:
            pass
        waited = time.monotonic() - started
    assert 9 < waited < 40, waited


@pytest.mark.parametrize("target", ["127.0.0.1:1", "127.0.0.1:443"])
def test_a_request_without_a_path_is_refused_before_any_check(stack: Stack, target: str) -> None:
    """CONNECT's target has no path: no permission of the map applies, and keysvc's 200
    sent it on to the upstream, which answered for itself."""
    key = stack.create_key(roles=["developer"])
    before = stack.verified()
    head = (
        f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Authorization: {key.headers['Authorization']}\r\n\r\n"
    )
    status, body = raw(stack.caddy.port, head.encode())
    assert status == 400, body
    assert json.loads(body)["error"] == REFUSED
    assert stack.verified() == before


def test_the_config_s_own_answers_are_envelopes_with_a_fresh_request_id(
    stack: Stack, tmp_path: Path
) -> None:
    """The 400 the config gives before any check, and its 503 when keysvc cannot be
    reached, carry a requestId as keysvc's answers do, a new one each time."""
    key = stack.create_key(roles=["developer"])
    ids = []
    for _ in range(2):
        answer = stack.get("/orders", key, **{"X-Key-Id": "forged"})
        assert answer.status == 400
        ids.append(answer.json()["requestId"])
    nowhere = tmp_path / "no-keysvc.sock"
    caddy = Caddy(
        caddy_binary(), tmp_path, nowhere, stack.upstream.base, stack.admin.organization_id
    )
    caddy.start()
    try:
        for _ in range(2):
            answer = call(caddy.port, "/orders", headers=key.headers, source=CLIENT)
            assert answer.status == 503
            assert answer.json()["status"] == 503
            ids.append(answer.json()["requestId"])
    finally:
        caddy.stop()
    assert all(UUID_PATTERN.fullmatch(request_id) for request_id in ids), ids
    assert len(set(ids)) == 4


@pytest.mark.parametrize(
    "name", ["X-RateLimit-Remaining", "x-ratelimit-limit", "X_RateLimit_Reset"]
)
def test_the_upstream_never_gets_a_client_s_rate_limit_headers(stack: Stack, name: str) -> None:
    """keysvc's X-RateLimit-* go to the client alone: an upstream that reads them from
    its request gets none, never the client's."""
    limited = stack.create_key(roles=["developer"], rateLimit={"limit": 100, "windowSeconds": 60})
    sent = {**limited.headers, name: "999999"}
    assert stack.through("/orders", sent) == (200, 1)
    assert not [
        header
        for header in stack.upstream.seen[-1]["headers"]
        if header.lower().replace("_", "-").startswith("x-ratelimit-")
    ]


def test_a_loopback_site_listens_on_loopback_alone(stack: Stack) -> None:
    """A site address names the Host Caddy matches, not where it listens: with
    KEYSVC_BIND=127.0.0.1 (as the docs say for a plain-HTTP loopback site) another
    address of the machine, here 127.0.0.3 with the site's Host, is refused."""
    port = stack.caddy.port
    with create_connection(("127.0.0.1", port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):
        create_connection(("127.0.0.3", port), timeout=5).close()
