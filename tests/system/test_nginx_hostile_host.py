"""The hostile review of the shipped nginx config's own answers and forwarded headers
(issue 35, /work/rt40-findings.md N1 and N2), through a real nginx running
docs/nginx-auth-request.conf in front of a real `keysvc serve` on its unix socket and
the echoing upstream: a client's Host never writes the Forwarded or X-Forwarded-Host the
upstream reads (N1), a request nginx refuses while reading it is a JSON envelope too
(N2), and no dotted spelling of keysvc's headers reaches the upstream (N6). keysvc gone
(N3): test_nginx.py::test_nginx_fails_closed_when_keysvc_is_unreachable."""

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.nginx import CLIENT, raw_answer
from tests.nginxstack import ENV, Stack, start_stack

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("nginx-hostile-host"), ENV)


@pytest.fixture(scope="module")
def auth(stack: Stack) -> str:
    return stack.create_key(roles=["developer"]).headers["Authorization"]


def request(method: str, target: str, *lines: str, version: str = "HTTP/1.1") -> bytes:
    head = [f"{method} {target} {version}", *lines, "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1")


# N1: Host values nginx accepts (it refuses space, tab, CR, "/", empty and two Hosts).
HOSTILE_HOSTS = [
    'a";for="1.2.3.4',
    'a",for="1.2.3.4',
    "a;for=1.2.3.4",
    'a";proto="https',
    'a";by="x',
    'good.example",host="evil.example',
    "evil.example,api.example",
    "<script>",
    "a\\b",
    "caf\xe9.example",
    '[::1";for="1.2.3.4]',
    "a=b",
]
# Valid Hosts, and what nginx makes of each ($host: lower case, no port).
VALID_HOSTS = [
    ("api.example", "api.example"),
    ("API.Example:444", "api.example"),
    ("127.0.0.1", "127.0.0.1"),
    ("[::1]:80", "[::1]"),
    ("localhost", "localhost"),
]


def _through(stack: Stack, auth: str, host: str, target: str = "/orders") -> dict[str, Any]:
    hits = len(stack.upstream.seen)
    status, _, body = raw_answer(
        stack.nginx.port, request("GET", target, f"Host: {host}", f"Authorization: {auth}")
    )
    assert status == 200, (host, body)
    [seen] = stack.upstream.seen[hits:]
    assert json.loads(body) == seen
    return seen


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_a_hostile_host_never_writes_the_upstream_s_forwarded(
    stack: Stack, auth: str, host: str
) -> None:
    """aiohttp's own RFC 7239 parser reads the one element nginx made: the client's
    address as nginx saw it and the scheme, no host; and no X-Forwarded-Host."""
    seen = _through(stack, auth, host)
    assert seen["forwarded"] == [{"for": CLIENT, "proto": "http"}], seen["headers"]
    received = {name.lower() for name, _ in seen["raw_headers"]}
    assert "x-forwarded-host" not in received, seen["headers"]
    assert seen["headers"]["X-Forwarded-For"] == CLIENT
    assert seen["headers"]["X-Forwarded-Proto"] == "http"


@pytest.mark.parametrize(("host", "validated"), VALID_HOSTS)
def test_a_valid_host_reaches_the_upstream_as_nginx_read_it(
    stack: Stack, auth: str, host: str, validated: str
) -> None:
    seen = _through(stack, auth, host)
    assert seen["forwarded"] == [{"for": CLIENT, "host": validated, "proto": "http"}]
    assert seen["headers"]["X-Forwarded-Host"] == validated


def test_an_absolute_form_target_s_host_wins_and_is_validated_too(stack: Stack, auth: str) -> None:
    seen = _through(stack, auth, 'h";for="9.9.9.9', "http://abs.example/orders")
    assert seen["forwarded"] == [{"for": CLIENT, "host": "abs.example", "proto": "http"}]
    assert seen["headers"]["X-Forwarded-Host"] == "abs.example"


# N2: requests nginx refuses while reading them, each with the status it keeps.
HOST = "Host: x"
REFUSED_BY_NGINX = {
    "a 10 KB URI": (414, request("GET", "/" + "a" * 10000, HOST)),
    "a 9 KB header line": (400, request("GET", "/orders", HOST, "X-Big: " + "a" * 9000)),
    "6 headers of 7 KB": (
        400,
        request("GET", "/orders", HOST, *(f"X-B{i}: {'a' * 7000}" for i in range(6))),
    ),
    "TRACE": (405, request("TRACE", "/orders", HOST)),
    "a bad method token": (400, request("G@T", "/orders", HOST)),
    "HTTP/2.0 in the request line": (505, request("GET", "/orders", HOST, version="HTTP/2.0")),
    "HTTP/3.0 in the request line": (505, request("GET", "/orders", HOST, version="HTTP/3.0")),
    "Transfer-Encoding: gzip, chunked": (
        501,
        request("POST", "/orders", HOST, "Transfer-Encoding: gzip, chunked") + b"0\r\n\r\n",
    ),
    "Transfer-Encoding and Content-Length": (
        400,
        request("POST", "/orders", HOST, "Transfer-Encoding: chunked", "Content-Length: 5")
        + b"0\r\n\r\n",
    ),
    "two Content-Length": (
        400,
        request("POST", "/orders", HOST, "Content-Length: 1", "Content-Length: 1") + b"x",
    ),
    "two Authorization": (
        400,
        request("GET", "/orders", HOST, "Authorization: Basic eDp5", "Authorization: Basic eDp5"),
    ),
    "a NUL in a header": (400, request("GET", "/orders", HOST, "X-A: a\x00b")),
    "a control byte in the query": (400, request("GET", "/orders?a=\x01", HOST)),
    "%00 in the path": (400, request("GET", "/orders%00", HOST)),
    "%zz in the path": (400, request("GET", "/or%zzders", HOST)),
    "/.. above the root": (400, request("GET", "/../x", HOST)),
    "HTTP/1.1 without Host": (400, request("GET", "/orders")),
}


@pytest.mark.parametrize("case", list(REFUSED_BY_NGINX))
def test_a_request_nginx_refuses_while_reading_it_is_an_envelope(stack: Stack, case: str) -> None:
    status, head = REFUSED_BY_NGINX[case]
    hits = len(stack.upstream.seen)
    seen: set[str] = set()
    for _ in range(2):
        answered, headers, body = raw_answer(stack.nginx.port, head)
        assert answered == status, (answered, body[:300])
        assert headers["content-type"] == "application/json", body[:300]
        envelope = json.loads(body)
        assert envelope["status"] == status and envelope["error"], envelope
        assert UUID4.match(envelope["requestId"]), envelope
        seen.add(envelope["requestId"])
    assert len(seen) == 2  # fresh each time
    assert len(stack.upstream.seen) == hits


def test_a_normal_request_still_passes(stack: Stack, auth: str) -> None:
    status, _, body = raw_answer(
        stack.nginx.port, request("GET", "/orders", HOST, f"Authorization: {auth}")
    )
    assert status == 200 and json.loads(body)["path"] == "/orders"


# rt40 N6, through nginx: keysvc's names with "." or "_" for a "-" (PHP folds both into
# keysvc's). nginx ignores such names by default (ignore_invalid_headers), and the
# allow-list forwards none of the client's under those names anyway.
FAMILIES = re.compile(r"^x-(key-|credits-|organization-id$|ratelimit-)")
DOTTED = ["X-Key.Permissions", "X.Key-Id", "X_Key.Permissions", "X-Credits.Remaining"]


@pytest.mark.parametrize("name", DOTTED)
def test_no_spelling_of_keysvc_s_headers_reaches_the_upstream(
    stack: Stack, auth: str, name: str
) -> None:
    hits = len(stack.upstream.seen)
    status, _, body = raw_answer(
        stack.nginx.port,
        request("GET", "/orders", HOST, f"Authorization: {auth}", f"{name}: forged"),
    )
    assert status == 200, body
    [seen] = stack.upstream.seen[hits:]
    folded = [re.sub(r"[_. ]", "-", n.lower()) for n, _ in seen["raw_headers"]]
    assert sorted(n for n in folded if FAMILIES.match(n)) == [
        "x-key-id",
        "x-key-permissions",
        "x-organization-id",
    ]
    assert "forged" not in [value for _, value in seen["raw_headers"]]
