"""The hostile review of the shipped docs/Caddyfile (issue 38, /work/rt40-findings.md N3-N7),
through a real Caddy in front of a real `keysvc serve` on its unix socket and the echoing
upstream: the client headers that name who called, from where, over what, or which path
and method never reach the upstream (N5), nor any spelling of keysvc's headers a CGI or
PHP upstream folds into keysvc's (N6); keysvc down is a 503 with Retry-After (N3); and an
upstream that never answers is a 504 within the configured bound (N4); and a client's huge
header is refused by Caddy itself, never a 502 (N7)."""

import http.client
import itertools
import json
import re
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from keysvc.http.middleware import MAX_LINE_BYTES
from tests.caddy import CADDYFILE, Caddy, Stack, caddy_binary, start_stack
from tests.nginx import CLIENT, raw_answer

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("caddy-hostile-forwarding"))


# N5: the finding's headers, each with a value the client chose.
CALLER_HEADERS = {
    "Forwarded": 'for="1.2.3.4";proto=https;host=evil.example',
    "X-Real-IP": "1.2.3.4",
    "True-Client-IP": "1.2.3.4",
    "CF-Connecting-IP": "1.2.3.4",
    "X-Client-IP": "1.2.3.4",
    "X-Cluster-Client-IP": "1.2.3.4",
    "Fastly-Client-IP": "1.2.3.4",
    "X-Forwarded-Port": "443",
    "X-Forwarded-Ssl": "on",
    "X-Forwarded-Scheme": "https",
    "X-Forwarded-Prefix": "/admin",
    "X-Forwarded-Server": "evil.example",
    "X-Scheme": "https",
    "X-Url-Scheme": "https",
    "Front-End-Https": "on",
    "X-Host": "evil.example",
    "Cookie": "session=someone-else",
    "X-Original-URL": "/admin",
    "X-Rewrite-URL": "/admin",
    "X-Original-URI": "/admin",
    "X-Original-Host": "evil.example",
    "X-Forwarded-Uri": "/admin",
    "X-Forwarded-Method": "DELETE",
    "X-HTTP-Method-Override": "DELETE",
    "X-HTTP-Method": "DELETE",
    "X-Method-Override": "DELETE",
    "X-User-Id": "someone-else",
    "X-Remote-User": "someone-else",
    "Remote-User": "someone-else",
    "X-Auth-Request-User": "someone-else",
    "X-Tenant-Id": "someone-else",
    "X-Api-Key": "someone-else",
    # rt41 R2: what PHP's classic "client IP" helper reads first, and other proxies'.
    "Client-Ip": "1.2.3.4",
    "Http-Client-Ip": "1.2.3.4",
    "Proxy-Client-Ip": "1.2.3.4",
    "Wl-Proxy-Client-Ip": "1.2.3.4",
    "X-Forwarded": "for=1.2.3.4",
    "Forwarded-For": "1.2.3.4",
    "X-Originating-Ip": "1.2.3.4",
    "X-Proxyuser-Ip": "1.2.3.4",
    "X-Envoy-External-Address": "1.2.3.4",
    "Via": "1.1 evil.example",
    "Cookie2": "session=someone-else",
    "X-Authenticated-User": "someone-else",
    "X-Verified": "yes",
    # keysvc's own request names: set by the Caddyfile for keysvc alone.
    "X-Required-Permission": "reports:read",
    "X-Required-Organization": "someone-else",
    "X-Credit-Cost": "0",
    "X-Ratelimit": "tokens;cost=0",
}


def test_the_upstream_never_gets_the_client_s_caller_address_scheme_or_path_headers(
    stack: Stack,
) -> None:
    key = stack.create_key(roles=["developer"])
    sent = {**key.headers, **CALLER_HEADERS, "X-Forwarded-For": "1.2.3.4"}
    sent["X-Forwarded-Proto"] = "https"
    sent["X-Forwarded-Host"] = "evil.example"
    assert stack.through("/orders", sent) == (200, 1)
    seen = stack.upstream.seen[-1]
    received = {name.lower(): value for name, value in seen["raw_headers"]}
    assert not {name.lower() for name in CALLER_HEADERS} & set(received), received
    assert "someone-else" not in received.values()
    # Caddy's own view of the client, never the client's.
    assert received["x-forwarded-for"] == CLIENT
    assert received["x-forwarded-proto"] == "http"
    assert received["x-forwarded-host"] == f"127.0.0.1:{stack.caddy.port}"
    assert seen["forwarded"] == []
    assert received["x-key-id"] == key.id
    assert "authorization" not in received


def test_the_headers_api_clients_need_still_reach_the_upstream(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    api = {
        "Idempotency-Key": "order-7f3a",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "X-Request-Id": "req-42",
        "If-None-Match": '"abc"',
        "Origin": "https://app.example",
        "Content-Type": "application/json",
    }
    assert stack.through("/orders", {**key.headers, **api}) == (200, 1)
    received = {name.lower(): value for name, value in stack.upstream.seen[-1]["raw_headers"]}
    for name, value in api.items():
        assert received.get(name.lower()) == value, (name, received)


# N6: keysvc's names with ".", "_" for a "-", in any place, any case.
FAMILIES = re.compile(r"^x-(key-|credits-|organization-id$|ratelimit-)")
SPELLINGS = [
    "X-Key.Permissions",
    "x-key.permissions",
    "X.Key-Permissions",
    "X.Key.Permissions",
    "X_Key.Permissions",
    "X-Key.External-Id",
    "X-Key.Id",
    "X-Credits.Remaining",
    "X.Credits.Identity.Remaining",
    "X-Organization.Id",
    "X.Organization_Id",
    "X-RateLimit.Limit",
    "X_Key_Permissions",
    "X-Key-Permissions.",
]


def folded(name: str) -> str:
    """A header name as PHP's $_SERVER and CGI read it, written back with "-"."""
    return re.sub(r"[_. ]", "-", name.lower())


@pytest.mark.parametrize("name", SPELLINGS)
def test_no_spelling_of_keysvc_s_headers_reaches_the_upstream(stack: Stack, name: str) -> None:
    key = stack.create_key(roles=["developer"])  # no externalId, no credits
    assert stack.through("/orders", {**key.headers, name: "forged"}) == (200, 1)
    raw_headers = stack.upstream.seen[-1]["raw_headers"]
    ours = {folded(n): v for n, v in raw_headers if FAMILIES.match(folded(n))}
    assert ours == {
        "x-key-id": key.id,
        "x-key-permissions": "keys:read,roles:read",
        "x-organization-id": stack.admin.organization_id,
    }, raw_headers
    assert "forged" not in [value for _, value in raw_headers]
    # Each of keysvc's headers once, under its own name.
    assert len([n for n, _ in raw_headers if FAMILIES.match(folded(n))]) == 3


def test_every_mix_of_separators_in_keysvc_s_names_is_kept_from_the_upstream(
    stack: Stack,
) -> None:
    """Each "-", "_" and "." mix of the five names keysvc answers with (63 names): all
    "-" is refused (400), any other never reaches the upstream."""
    key = stack.create_key(roles=["developer"])
    names = ["X-Key-Permissions", "X-Key-Id", "X-Organization-Id", "X-Credits-Remaining"]
    mixes = []
    for name in [*names, "X-Key-External-Id"]:
        parts = name.split("-")
        for separators in itertools.product("-_.", repeat=len(parts) - 1):
            mixes.append(
                parts[0] + "".join(s + p for s, p in zip(separators, parts[1:], strict=True))
            )
    assert len(mixes) == 63
    for name in mixes:
        status, reached = stack.through("/orders", {**key.headers, name: "forged"})
        if "_" not in name and "." not in name:
            assert (status, reached) == (400, 0), name
            continue
        assert (status, reached) == (200, 1), name
        raw_headers = stack.upstream.seen[-1]["raw_headers"]
        assert "forged" not in [value for _, value in raw_headers], (name, raw_headers)


# N7
def _with_header_of(stack: Stack, key: Any, size: int) -> tuple[int, bytes]:
    """A request through Caddy with an X-Big header of ``size`` bytes: status and body."""
    head = (
        f"GET /orders HTTP/1.1\r\nHost: 127.0.0.1:{stack.caddy.port}\r\n"
        f"Authorization: {key.headers['Authorization']}\r\nX-Big: {'a' * size}\r\n"
        "Connection: close\r\n\r\n"
    )
    status, _, body = raw_answer(stack.caddy.port, head.encode(), 30)
    return status, body


@pytest.mark.parametrize(
    ("size", "status"), [(7_000, 200), (20_000, 431), (200_000, 431), (1_000_000, 431)]
)
def test_a_huge_header_is_refused_never_a_502(stack: Stack, size: int, status: int) -> None:
    """Past the Caddyfile's 10 KiB of headers, Go's own 431 before keysvc is asked (a
    20 KB line forwarded was keysvc's 400 or, keysvc closing as Caddy still wrote, a 503 on
    a busy machine; 200 KB to 1 MiB a 502 at will); below it, the request is served."""
    key = stack.create_key(roles=["developer"])
    before = stack.verified()
    statuses = {_with_header_of(stack, key, size)[0] for _ in range(5)}
    assert statuses == {status}, statuses
    if status == 431:
        assert stack.verified() == before  # keysvc never asked


def test_a_path_go_escapes_three_times_over_is_never_keysvc_s_refusal(stack: Stack) -> None:
    """rt41 R1: Caddy writes the path again, escaped (a byte 0x80 as %80), into the
    X-Forwarded-Uri it sent keysvc, which reads none: 6,000 such bytes were keysvc's
    400 "too long" (and, keysvc closing while Caddy wrote, its 503 at random). Now
    keysvc is asked and answers; the upstream's own limits are its own."""
    key = stack.create_key(roles=["developer"])
    for _ in range(3):
        before = stack.verified()
        head = (
            b"GET /orders/"
            + b"\x80" * 6_000
            + b" HTTP/1.1\r\n"
            + f"Host: 127.0.0.1:{stack.caddy.port}\r\n".encode()
            + f"Authorization: {key.headers['Authorization']}\r\nConnection: close\r\n\r\n".encode()
        )
        status, _, body = raw_answer(stack.caddy.port, head, 30)
        assert status not in {502, 503, 504}, (status, body)
        assert stack.verified() == before + 1, (status, body)  # keysvc verified it


def test_more_header_lines_than_keysvc_reads_are_its_400_never_a_503(stack: Stack) -> None:
    """rt41 R1, second trigger: 1,000 small headers (under Caddy's 10 KiB) reach keysvc,
    which reads 128: its 400, and, as keysvc closed while Caddy still wrote them, at
    random Caddy's 503 "authorization unavailable". keysvc now reads the rest and drops
    it before closing."""
    key = stack.create_key(roles=["developer"])
    many = "".join(f"X-H{n}: v\r\n" for n in range(1_000))
    statuses = set()
    for _ in range(20):
        head = (
            f"GET /orders HTTP/1.1\r\nHost: 127.0.0.1:{stack.caddy.port}\r\n"
            f"Authorization: {key.headers['Authorization']}\r\n{many}Connection: close\r\n\r\n"
        )
        status, _, body = raw_answer(stack.caddy.port, head.encode(), 30)
        statuses.add(status)
        if status == 400:
            assert json.loads(body)["error"].startswith("malformed HTTP request"), body
    assert statuses == {400}, statuses


def test_every_header_caddy_forwards_fits_keysvcs_line_limit(stack: Stack) -> None:
    """The longest header line Caddy lets through (found by bisection) is shorter than
    keysvc's 16 KiB a line: keysvc never refuses, and closes on, a request Caddy is still
    writing to it."""
    key = stack.create_key(roles=["developer"])
    accepted, refused = 1_000, 64 * 1024
    assert _with_header_of(stack, key, accepted)[0] == 200
    assert _with_header_of(stack, key, refused)[0] == 431
    while refused - accepted > 1:
        size = (accepted + refused) // 2
        status, body = _with_header_of(stack, key, size)
        # 400: the test's upstream (aiohttp's own 8 KiB a line), once keysvc let it on.
        assert status in {200, 400, 431}, (size, status, body)
        accepted, refused = (size, refused) if status != 431 else (accepted, size)
    assert len("X-Big: ") + accepted < MAX_LINE_BYTES, accepted


def _get_slowly(
    port: int, headers: dict[str, str], timeout: float
) -> tuple[int, dict[str, Any], float]:
    """One request through Caddy; its status, envelope and how long it took."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=timeout, source_address=(CLIENT, 0)
    )
    started = time.monotonic()
    try:
        connection.request("GET", "/orders", headers=headers)
        response = connection.getresponse()
        status, body = response.status, json.loads(response.read())
        retry_after = response.headers["Retry-After"]
    except TimeoutError:
        status, body, retry_after = 0, {}, None
    finally:
        connection.close()
    return status, {**body, "retry_after": retry_after}, time.monotonic() - started


# N3
def test_keysvc_down_is_a_503_with_retry_after(tmp_path: Path) -> None:
    with ExitStack() as resources:
        own = start_stack(resources, tmp_path)
        key = own.create_key(roles=["developer"])
        assert own.through("/orders", key.headers) == (200, 1)
        own.keysvc.stop()
        status, body, _ = _get_slowly(own.caddy.port, key.headers, 30)
        assert (status, body["status"], body["retry_after"]) == (503, 503, "5"), body
        assert body["error"] == "authorization unavailable: try again later"
        assert UUID4.match(body["requestId"]), body
        assert len(own.upstream.seen) == 1


# N4
def test_an_upstream_that_never_answers_is_a_504_within_the_bound(
    stack: Stack, tmp_path: Path
) -> None:
    """The bound is KEYSVC_UPSTREAM_TIMEOUT (60 s unless set, as nginx's read timeout),
    set short here; a listener that accepts and never answers is the upstream."""
    assert "response_header_timeout {$KEYSVC_UPSTREAM_TIMEOUT:60s}" in CADDYFILE.read_text()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        upstream = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert stack.keysvc.unix is not None
        caddy = Caddy(
            caddy_binary(), tmp_path, stack.keysvc.unix, upstream, stack.admin.organization_id
        )
        caddy.env["KEYSVC_UPSTREAM_TIMEOUT"] = "2s"
        caddy.start()
        try:
            key = stack.create_key(roles=["developer"])
            status, body, waited = _get_slowly(caddy.port, key.headers, 30)
        finally:
            caddy.stop()
    assert (status, body.get("status")) == (504, 504), (status, body, waited)
    assert UUID4.match(body["requestId"]), body
    assert 1.9 < waited < 10, waited
