"""A hostile client of the shipped docs/nginx-auth-request.conf, through a real nginx in
front of a real `keysvc serve` that lets nginx reuse its answers (the default 1 s): a
client with a valid key of its own sends every header keysvc reads or answers, with
the cache key's separator, empty and non-ASCII values, and tries to forge a cache entry
for a path, or for another organization's server block sharing the cache zone. It
never gets more than its key allows: headers only keysvc may give never reach the
upstream under any spelling (it gets keysvc's own, and only the client headers the
config names), none of the client's reach keysvc, credits are spent at the config's
cost, and no secret is written to nginx's cache files.
"""

import base64
import hashlib
import hmac
import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from tests.helpers import Creds, basic
from tests.nginx import CLIENT, EXAMPLE_ORGANIZATION, call, nginx_binary, render, wrap
from tests.nginxstack import ENV, Stack, early_in_a_second, start_stack
from tests.server import free_port

# The HMAC key docs/nginx-auth-request.conf gives set_hmac_sha256 (no secret).
CACHE_MAC_KEY = b"keysvc-nginx-cache-key"
OTHER_ORGANIZATION = "0e4f6b5a-1c2d-4e3f-8a9b-0c1d2e3f4a5b"
# Headers only keysvc's answer may give the upstream (and the client's rate-limit ones).
KEYSVC_ANSWERS = (
    "X-Key-Id",
    "X-Organization-Id",
    "X-Key-Permissions",
    "X-Key-External-Id",
    "X-Credits-Remaining",
    "X-Key-Anything-Later",
    "X-Credits-Spent",
)
# Values each is sent with: the separator, empty, non-ASCII (sent as Latin-1 bytes).
HOSTILE_VALUES = ("*", "", "a|b|c", "caf\u00e9 \u00ff")
# Headers keysvc reads from the auth subrequest, as a client would send them itself.
KEYSVC_READS = {
    "X-Required-Permission": "",
    "X-Required-Organization": OTHER_ORGANIZATION,
    "X-Credit-Cost": "0",
    "X-Ratelimit": "tokens;cost=0",
    "X-Forwarded-For": "10.9.9.9|reports:read|1.2.3.4",
    "X-Original-URI": "/orders",
    "X-Original-Method": "GET",
    "Accept": "application/json",
}
REFUSED = (
    "bad request: send the path without ; \\ % or . and .. segments, and no | in Authorization"
)
# A header name of the families only keysvc's answer may give, however spelt: case, and
# "_" for "-" (which an upstream such as a CGI or WSGI server reads alike).
KEYSVC_FAMILY = re.compile(r"^x[-_](key[-_]|credits[-_]|organization[-_]id$)", re.I)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("nginx-hostile"), ENV)


def through(stack: Stack, path: str, headers: dict[str, str], port: int = 0) -> tuple[int, int]:
    """One request through nginx from the client's address: nginx's status, and how
    many requests the upstream saw for it (0 or 1)."""
    hits = len(stack.upstream.seen)
    answer = call(port or stack.nginx.port, path, headers=headers, source=CLIENT)
    return answer.status, len(stack.upstream.seen) - hits


# A name in the X-Key-* family whose nginx header hash (h * 31 + c over its lowercase
# bytes, 64 bits) is 0, found by lattice reduction in a few minutes: nginx marks such a
# header deleted for njs, whose r.headersIn and r.rawHeadersIn skip it, while its proxy
# module still forwards it.
HASH_ZERO_NAME = "X-Key-rejwpfogoloknhok"


def nginx_header_hash(name: str) -> int:
    value = 0
    for byte in name.lower().encode():
        value = (value * 31 + byte) % 2**64
    return value


def keysvc_family(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The headers of keysvc's families the upstream received, repeated ones too, by
    lowercase name, sorted."""
    return sorted(
        (name.lower(), value) for name, value in record["raw_headers"] if KEYSVC_FAMILY.match(name)
    )


def keysvc_gave(stack: Stack, key: Creds) -> list[tuple[str, str]]:
    """What keysvc's answer gives the upstream for a developer key without credits."""
    return sorted(
        [
            ("x-key-id", key.id),
            ("x-organization-id", stack.admin.organization_id),
            ("x-key-permissions", "keys:read,roles:read"),
        ]
    )


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize(
    "name", [*KEYSVC_ANSWERS, "x-KEY-id", "x-credits-REMAINING", "X_Key_Id", "X-Credits_Remaining"]
)
def test_a_header_only_keysvc_may_give_never_reaches_the_upstream(
    stack: Stack, name: str, value: str
) -> None:
    key = stack.create_key(roles=["developer"])
    answer = call(stack.nginx.port, "/orders", headers={**key.headers, name: value}, source=CLIENT)
    assert answer.status == 200, answer.body
    # The upstream got keysvc's answer's headers, each once, and none of the client's.
    assert keysvc_family(stack.upstream.seen[-1]) == keysvc_gave(stack, key)
    assert keysvc_family(answer.json()) == keysvc_gave(stack, key)


def test_repeated_and_underscored_headers_of_keysvc_never_reach_the_upstream(
    stack: Stack,
) -> None:
    key = stack.create_key(roles=["developer"])
    forged = [
        ("X-Key-Id", "forged-1"),
        ("X-Key-Id", "forged-2"),
        ("x-organization-id", OTHER_ORGANIZATION),
        ("X-Organization-Id", OTHER_ORGANIZATION),
        ("X_Key_Permissions", "*"),
        ("X-Key_External-Id", "victim"),
        ("X-CREDITS-REMAINING", "1000000"),
        ("X-Credits-Remaining", "1000000"),
        (HASH_ZERO_NAME, "forged"),
    ]
    lines = "".join(f"{name}: {value}\r\n" for name, value in forged)
    head = (
        "GET /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: {key.headers['Authorization']}\r\n{lines}\r\n"
    )
    hits = len(stack.upstream.seen)
    status, body = raw(stack.nginx.port, head.encode())
    assert status == 200, body
    assert len(stack.upstream.seen) == hits + 1
    received = stack.upstream.seen[-1]
    assert keysvc_family(received) == keysvc_gave(stack, key)
    sent_values = {value for _, value in forged}
    assert not [pair for pair in received["raw_headers"] if pair[1] in sent_values]


def test_a_header_name_whose_nginx_hash_is_zero_never_reaches_the_upstream(stack: Stack) -> None:
    # Such a name was invisible to njs (the scan that refused the others before could
    # not see it) and was forwarded by nginx's proxy module: now no client header is, but
    # those the config names.
    assert nginx_header_hash(HASH_ZERO_NAME) == 0
    assert nginx_header_hash(HASH_ZERO_NAME[:-1] + "j") != 0
    key = stack.create_key(roles=["developer"])
    for name in (HASH_ZERO_NAME, HASH_ZERO_NAME[:-1] + "j"):
        assert through(stack, "/orders", {**key.headers, name: "forged"}) == (200, 1)
        received = stack.upstream.seen[-1]
        assert keysvc_family(received) == keysvc_gave(stack, key)
        assert not [pair for pair in received["raw_headers"] if pair[1] == "forged"]


def test_headers_keysvc_reads_never_reach_it_from_the_client(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], ipAccessList=[{"source": "10.9.9.9/32"}])
    # Its address is 127.0.0.2 whatever X-Forwarded-For says: refused.
    assert through(stack, "/orders", {**limited.headers, **KEYSVC_READS}) == (403, 0)
    key = stack.create_key(roles=["developer"])
    # Another organization required, a JSON answer asked for: neither reaches keysvc.
    assert through(stack, "/orders", {**key.headers, **KEYSVC_READS}) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert received["X-Key-Id"] == key.id
    assert received["X-Organization-Id"] == stack.admin.organization_id
    # The upstream too gets nginx's view of the client, not the client's headers.
    assert received["X-Forwarded-For"] == CLIENT
    for name in ("X-Required-Organization", "X-Credit-Cost", "X-Original-URI", "X-Ratelimit"):
        assert name not in received
    # A permission the path needs is not waived by an empty or a wildcard requirement.
    for value in ("", "*", "orders:read"):
        sent = {**key.headers, **KEYSVC_READS, "X-Required-Permission": value}
        assert through(stack, "/reports/q1", sent) == (403, 0)


def test_a_forged_cache_key_never_passes_a_path_s_permission(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])  # no reports:read
    organization = stack.admin.organization_id
    token = key.headers["Authorization"].removeprefix("Basic ")
    for _ in range(5):
        early_in_a_second()  # the primer's answer is kept until the second's end
        primer = {**key.headers, "X-Forwarded-For": f"{organization}|reports:read|1.2.3.4"}
        assert through(stack, "/orders", primer) == (200, 1)
        forged = {"Authorization": f"Basic {token}|{organization}|", "X-Forwarded-For": "1.2.3.4"}
        assert through(stack, "/reports/q1", forged) == (400, 0)
        assert through(stack, "/reports/q1", key.headers) == (403, 0)


def test_a_forged_cache_key_never_passes_another_organization_s_server(tmp_path: Path) -> None:
    # Two server blocks sharing the cache zone: this organization's, then another's.
    with ExitStack() as resources:
        own = start_stack(resources, tmp_path, ENV)
        own.nginx.stop()
        other_port = free_port()
        assert own.keysvc.unix is not None
        rendered = render(
            own.nginx.port,
            own.keysvc.unix,
            own.upstream.base,
            own.admin.organization_id,
            own.nginx.cache,
        )
        server = rendered[rendered.index("\nserver {") :]
        other = server.replace(f":{own.nginx.port};", f":{other_port};").replace(
            own.admin.organization_id, OTHER_ORGANIZATION
        )
        own.nginx.conf.write_text(wrap(own.nginx.directory, rendered + other))
        own.nginx.test_config()
        own.nginx.start()
        key = own.create_key(roles=["developer"])
        token = key.headers["Authorization"].removeprefix("Basic ")
        for _ in range(3):
            early_in_a_second()
            primer = {**key.headers, "X-Forwarded-For": f"{OTHER_ORGANIZATION}||1.2.3.4"}
            assert through(own, "/orders", primer) == (200, 1)
            forged = {
                "Authorization": f"Basic {token}|{own.admin.organization_id}|",
                "X-Forwarded-For": "1.2.3.4",
            }
            assert through(own, "/orders", forged, port=other_port) == (400, 0)
            assert through(own, "/orders", key.headers, port=other_port) == (403, 0)


def test_the_cache_key_holds_the_credentials_hmac_and_nothing_else_of_them(
    stack: Stack,
) -> None:
    # Each kept answer's file names its cache key: the fixed parts, then the
    # Authorization header's HMAC-SHA256 (base64) that set-misc computed, one per
    # credentials, the wrong secret's its own.
    key = stack.create_key(roles=["developer"])
    wrong = basic(key.key_id, "x" * len(key.secret))
    for headers in (key.headers, wrong):
        through(stack, "/orders", headers)
    keys = set()
    for path in stack.nginx.cache.rglob("*"):
        if path.is_file():
            head = path.read_bytes().split(b"\nKEY: ", 1)[1]
            keys.add(head.split(b"\n", 1)[0].decode())
    for headers in (key.headers, wrong):
        mac = hmac.new(CACHE_MAC_KEY, headers["Authorization"].encode(), hashlib.sha256)
        expected = base64.b64encode(mac.digest()).decode()
        assert any(kept.endswith(f"|{CLIENT}|{expected}") for kept in keys), (keys, expected)


def test_nginx_without_the_set_misc_module_refuses_the_config(tmp_path: Path) -> None:
    # No module, no digest: nginx does not start, rather than key the cache on less.
    conf = tmp_path / "nginx.conf"
    block = render(
        free_port(), tmp_path / "k.sock", "http://127.0.0.1:9", EXAMPLE_ORGANIZATION, tmp_path / "c"
    )
    text = wrap(tmp_path, block)
    assert "load_module" in text
    conf.write_text("".join(line for line in text.splitlines(True) if "load_module" not in line))
    checked = subprocess.run(
        [nginx_binary(), "-t", "-p", f"{tmp_path}/", "-c", str(conf), "-e", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode != 0
    assert 'unknown directive "set_hmac_sha256"' in checked.stderr, checked.stderr


def test_a_location_added_without_the_digest_refuses_every_request(tmp_path: Path) -> None:
    # rt41 R7: a location an operator adds with auth_request but without location /'s
    # set lines keyed every caller's answer on an empty digest: after one valid key's
    # 200, no credentials and a wrong secret got it too. The auth location refuses an
    # empty digest (500, never asked of keysvc, never kept).
    with ExitStack() as resources:
        stack = start_stack(resources, tmp_path, ENV)
        stack.nginx.stop()
        conf = stack.nginx.conf.read_text()
        added = (
            "    location /extra {\n        auth_request /_keysvc_verify;\n"
            f"        proxy_pass {stack.upstream.base}/;\n    }}\n\n    location / {{"
        )
        assert conf.count("    location / {") == 1
        stack.nginx.conf.write_text(conf.replace("    location / {", added))
        stack.nginx.test_config()
        stack.nginx.start()
        key = stack.create_key(roles=["developer"])
        wrong = basic(key.key_id, "x" * len(key.secret))
        before = stack.verified()
        for headers in (key.headers, {}, wrong, key.headers):
            answer = call(stack.nginx.port, "/extra", headers=headers, source=CLIENT)
            assert answer.status == 500, (headers, answer.status, answer.body)
            assert answer.json()["status"] == 500
            assert answer.headers["Retry-After"] is None  # the config's error, no outage
        assert stack.verified() == before  # keysvc never asked
        assert not stack.upstream.seen
        # location / is as before.
        assert through(stack, "/orders", key.headers) == (200, 1)


def remaining(stack: Stack, key: Creds) -> int:
    result: dict[str, Any] = stack.api("GET", f"/keys/{key.id}")
    return int(result["credits"]["remaining"])


@pytest.mark.parametrize("cost", ["0", "abc", "-1", ""])
def test_credits_are_spent_at_the_config_s_cost_whatever_the_client_says(
    stack: Stack, cost: str
) -> None:
    key = stack.create_key(roles=["developer"], credits={"remaining": 5, "refill": None})
    sent = {**key.headers, "X-Credit-Cost": cost}
    statuses = [through(stack, "/orders", sent)[0] for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    assert remaining(stack, key) == 0
    # What reached the upstream came from keysvc's answer.
    assert stack.upstream.seen[-1]["headers"]["X-Credits-Remaining"] == "0"


def test_a_client_s_x_ratelimit_never_reaches_keysvc(stack: Stack) -> None:
    """Issue 36: a key's named limit counts only what the config names (nothing here),
    whatever X-Ratelimit the client sends; a key without that limit is not refused for
    a name that never reached keysvc."""
    tokens = {"name": "tokens", "limit": 1, "windowSeconds": 3600}
    key = stack.create_key(roles=["developer"], ratelimits=[tokens])
    for cost in ("5", "0", "1000000", "x"):
        sent = {**key.headers, "X-Ratelimit": f"tokens;cost={cost}, other"}
        assert through(stack, "/orders", sent) == (200, 1)
    plain = stack.create_key(roles=["developer"])
    assert through(stack, "/orders", {**plain.headers, "X-Ratelimit": "tokens"}) == (200, 1)


def test_the_upstream_gets_keysvc_s_external_id_and_credits_alone(stack: Stack) -> None:
    external = "M\u00fcller 50% \U0001d11e"
    key = stack.create_key(roles=["developer"], externalId=external, credits={"remaining": 9})
    assert through(stack, "/orders", key.headers) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert received["X-Key-External-Id"] == "M%C3%BCller 50%25 %F0%9D%84%9E"
    assert unquote(received["X-Key-External-Id"]) == external
    assert received["X-Credits-Remaining"] == "8"
    # A key without either: the upstream gets neither header.
    plain = stack.create_key(roles=["developer"])
    assert through(stack, "/orders", plain.headers) == (200, 1)
    received = stack.upstream.seen[-1]["headers"]
    assert "X-Key-External-Id" not in received and "X-Credits-Remaining" not in received


def test_the_largest_answer_headers_pass_and_are_kept(stack: Stack) -> None:
    # keysvc's largest: a full X-Key-Permissions (3,072 characters) and an externalId of
    # 255 four-byte characters, 3,060 characters percent-encoded.
    granted = sorted(f"svc{n:02d}:{'c' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": "widest", "permissions": granted})
    external = "\U0001d11e" * 255
    key = stack.create_key(assignedRoleIds=[role["id"]], externalId=external)
    for _ in range(5):
        second = int(early_in_a_second())
        before = stack.verified()
        statuses = [through(stack, "/orders", key.headers)[0] for _ in range(3)]
        if int(time.time()) == second:
            break
    assert statuses == [200] * 3, stack.nginx.log()[-2000:]
    assert stack.verified() == before + 1  # kept, and served from the cache
    received = stack.upstream.seen[-1]["headers"]
    assert len(received["X-Key-Permissions"]) > 3000
    assert len(received["X-Key-External-Id"]) == 3060
    assert unquote(received["X-Key-External-Id"]) == external
    log = stack.nginx.log()
    assert "too big header" not in log and "upstream buffer is too small" not in log, log[-2000:]


def test_no_secret_is_written_to_the_cache_files(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    for url in ("/orders", "/reports/q1", "/orders/1"):
        through(stack, url, key.headers)
    basic = base64.b64encode(f"{key.key_id}:{key.secret}".encode())
    files = [path for path in stack.nginx.cache.rglob("*") if path.is_file()]
    assert files  # the answers were kept
    for path in files:
        content = path.read_bytes()
        assert key.secret.encode() not in content, path
        assert basic not in content, path


def raw(port: int, head: bytes) -> tuple[int, bytes]:
    """A request sent byte for byte from the client's address; nginx's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(CLIENT, 0)) as s:
        s.sendall(head)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("control", ["\x01", "\x7f", "\x1f"])
def test_credentials_keysvc_finds_malformed_are_a_400_never_a_500(
    stack: Stack, control: str
) -> None:
    key = stack.create_key(roles=["developer"])
    hits = len(stack.upstream.seen)
    authorization = key.headers["Authorization"] + control
    head = (
        "GET /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: {authorization}\r\n\r\n"
    )
    status, body = raw(stack.nginx.port, head.encode())
    assert status == 400, body
    answer = json.loads(body)
    assert answer.pop("requestId") and answer == {
        "status": 400,
        "error": "bad request: keysvc refused the credentials sent or the rate limits of the path",
    }
    assert len(stack.upstream.seen) == hits


@pytest.mark.parametrize("query", ["a=\x01", "a=\x7f", "\x00", "a=\x1b"])
@pytest.mark.parametrize("with_key", [True, False])
def test_a_control_character_in_the_query_is_a_400_never_a_500(
    stack: Stack, query: str, with_key: bool
) -> None:
    key = stack.create_key(roles=["developer"])
    hits = len(stack.upstream.seen)
    authorization = f"Authorization: {key.headers['Authorization']}\r\n" if with_key else ""
    head = f"GET /orders?{query} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{authorization}\r\n"
    status, body = raw(stack.nginx.port, head.encode())
    assert status == 400, body
    assert len(stack.upstream.seen) == hits


# The client headers the config forwards to the upstream, with a value each.
NAMED = {
    "Content-Type": "text/csv; charset=utf-8",
    "Content-Encoding": "identity",
    "Accept": "text/csv",
    "Accept-Encoding": "identity",
    "Accept-Language": "de-CH",
    "User-Agent": "hostile/1.0",
    "If-Match": '"v1"',
    "If-None-Match": '"v2"',
    "If-Modified-Since": "Wed, 21 Oct 2026 07:28:00 GMT",
    "If-Unmodified-Since": "Wed, 21 Oct 2026 07:28:00 GMT",
    "If-Range": '"v3"',
    "Range": "bytes=0-99",
}
# Client headers it does not name, some of them an upstream might believe.
UNNAMED = {
    "Cookie": "session=victim",
    "X-Forwarded-For": "10.0.0.1",
    "X-Forwarded-Host": "admin.example",
    "X-Forwarded-Proto": "https",
    "X-Real-IP": "10.0.0.1",
    "Forwarded": "for=10.0.0.1",
    "X-Custom": "anything",
}


def test_the_upstream_gets_the_named_client_headers_and_no_other(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    assert through(stack, "/orders", {**key.headers, **NAMED, **UNNAMED}) == (200, 1)
    received = stack.upstream.seen[-1]
    for name, value in NAMED.items():
        assert received["headers"].get(name) == value, name
    names = {name.lower() for name, _ in received["raw_headers"]}
    # nginx's own: the upstream's Host, its connection, and its view of the client.
    assert received["headers"]["Host"] == stack.upstream.base.removeprefix("http://")
    assert received["headers"]["X-Forwarded-For"] == CLIENT
    assert received["headers"]["X-Forwarded-Proto"] == "http"
    expected = {name.lower() for name in NAMED} | {name for name, _ in keysvc_gave(stack, key)}
    expected |= {"host", "connection", "x-forwarded-for", "x-forwarded-proto"}
    expected |= {"x-forwarded-host", "forwarded"}  # nginx's own, never the client's
    assert names == expected
    assert not [pair for pair in received["raw_headers"] if pair[1] in UNNAMED.values()]


def test_a_body_reaches_the_upstream_intact_with_its_length(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    authorization = key.headers["Authorization"]
    small = json.dumps({"item": "tea", "note": "caf\u00e9"})
    large = "".join(f"{n:07d}," for n in range(40000))  # 320,000 bytes: nginx's temp file
    for body in (small, large):
        head = (
            "POST /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Authorization: {authorization}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body.encode())}\r\n\r\n"
        )
        status, answer = raw(stack.nginx.port, head.encode() + body.encode())
        assert status == 200, answer[:200]
        received = stack.upstream.seen[-1]
        assert received["method"] == "POST"
        assert received["body"] == body
        assert received["headers"]["Content-Length"] == str(len(body.encode()))
        assert received["headers"]["Content-Type"] == "application/json"


def test_a_chunked_upload_reaches_the_upstream_intact(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    parts = ["first part\n", "second, " * 5000, "", "last"]
    chunks = "".join(f"{len(part.encode()):x}\r\n{part}\r\n" for part in parts if part)
    head = (
        "PUT /orders/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: {key.headers['Authorization']}\r\nContent-Type: text/plain\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    status, answer = raw(stack.nginx.port, (head + chunks + "0\r\n\r\n").encode())
    assert status == 200, answer[:200]
    received = stack.upstream.seen[-1]
    assert received["method"] == "PUT"
    assert received["body"] == "".join(parts)
    # nginx read the whole body and sent it with its length, not chunked.
    assert received["headers"]["Content-Length"] == str(len("".join(parts).encode()))
    assert "Transfer-Encoding" not in received["headers"]
