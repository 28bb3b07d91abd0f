"""The hostile review of the allow-list config (issue 35, /work/rtfwd-findings.md),
through a real nginx running the shipped docs/nginx-auth-request.conf in front of a real
`keysvc serve` on its unix socket: a reused answer never stands for a path that sends
keysvc other inputs (F1), keysvc's 503 and a frozen keysvc reach the client as bounded
envelopes (F2), the headers API clients need reach the upstream and the secret never does,
even with the allow-list switched off (F3), refusals are JSON envelopes (F4), the
config's method-aware map example holds (F7), no key ID or secret is written to the
access log (F8), and a 429 keeps X-RateLimit-* (F10)."""

import base64
import http.client
import json
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.nginx import CLIENT, Answer, call, render, wrap
from tests.nginxstack import ENV, Stack, early_in_a_second, start_stack

# The config's commented examples, switched on as an operator would.
RATELIMIT_EXAMPLE = '    # "~*^/v1/completions"  "tokens;cost=100";'
RATELIMIT_NAMED = '    "~*^/v1/completions"  "tokens;cost=100";'


def reconfigure(stack: Stack, *changes: tuple[str, str]) -> None:
    """nginx restarted on the shipped config with each (old, new) text replaced; each
    old text must occur exactly once."""
    stack.nginx.stop()
    assert stack.keysvc.unix is not None
    text = render(
        stack.nginx.port,
        stack.keysvc.unix,
        stack.upstream.base,
        stack.admin.organization_id,
        stack.nginx.cache,
    )
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    stack.nginx.conf.write_text(wrap(stack.nginx.directory, text))
    stack.nginx.test_config()
    stack.nginx.start()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        running = start_stack(resources, tmp_path_factory.mktemp("nginx-hostile-reuse"), ENV)
        reconfigure(running, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))
        yield running


def _get(stack: Stack, path: str, headers: dict[str, str], method: str = "GET") -> Answer:
    return call(stack.nginx.port, path, method=method, headers=headers, source=CLIENT)


# F1
def test_an_answer_reused_on_one_path_never_passes_a_metered_path(stack: Stack) -> None:
    """A key without the `tokens` limit the config names for /v1/completions is refused
    there (400), even right after a reusable 200 on /orders, same permission, same
    second: the path's named limit and cost are part of the cache key."""
    plain = stack.create_key(roles=["developer"])
    for _ in range(3):
        early_in_a_second()
        assert _get(stack, "/orders", plain.headers).status == 200
        hits = len(stack.upstream.seen)
        answers = [_get(stack, "/v1/completions", plain.headers) for _ in range(5)]
        assert [answer.status for answer in answers] == [400] * 5
        assert len(stack.upstream.seen) == hits
    # A limit the key lacks is no fault of its credentials (rt40 N8): a neutral text.
    assert answers[0].json()["error"] == (
        "bad request: keysvc refused the credentials sent or the rate limits of the path"
    )


# F10
def test_a_429_keeps_the_rate_limit_headers(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], rateLimit={"limit": 2, "windowSeconds": 60})
    for remaining in ("1", "0"):
        assert _get(stack, "/orders", limited.headers).headers["X-RateLimit-Remaining"] == remaining
    answer = _get(stack, "/orders", limited.headers)
    assert answer.status == 429, answer.body
    assert answer.json()["status"] == 429
    assert answer.headers["X-RateLimit-Limit"] == "2"
    assert answer.headers["X-RateLimit-Remaining"] == "0"
    reset, retry_after = answer.headers["X-RateLimit-Reset"], answer.headers["Retry-After"]
    assert reset is not None and 0 < int(reset) <= 60
    assert retry_after is not None and 0 < int(retry_after) <= 60


# F4
def _request_id(body: dict[str, object], seen: set[str]) -> None:
    """The envelope's requestId: a UUIDv4, as keysvc's own are, and not one seen before."""
    request_id = body["requestId"]
    assert isinstance(request_id, str) and UUID4.fullmatch(request_id), body
    assert request_id not in seen
    seen.add(request_id)


UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_keysvc_s_refusals_are_json_envelopes(stack: Stack) -> None:
    developer = stack.create_key(roles=["developer"])  # no reports:read
    wrong = {"Authorization": "Basic " + base64.b64encode(b"nobody:wrong").decode()}
    seen: set[str] = set()
    for headers, status in (({}, 401), (wrong, 401), (developer.headers, 403)):
        answer = _get(stack, "/reports/q1", headers)
        assert answer.status == status, answer.body
        assert answer.headers["Content-Type"] == "application/json", answer.body
        assert answer.json()["status"] == status
        _request_id(answer.json(), seen)
        if status == 401:
            assert answer.headers.get_all("WWW-Authenticate") == ['Basic realm="keysvc"']
    # The same refusals again, reused from nginx's cache.
    for headers, status in ((wrong, 401), (developer.headers, 403)):
        answer = _get(stack, "/reports/q1", headers)
        assert (answer.status, answer.json()["status"]) == (status, status), answer.body
        _request_id(answer.json(), seen)
    # The config's own: its internal location, and a body past client_max_body_size.
    internal = _get(stack, "/_keysvc_verify", developer.headers).json()
    assert internal["status"] == 404
    _request_id(internal, seen)
    big = call(
        stack.nginx.port,
        "/orders",
        method="POST",
        headers=developer.headers,
        body="x" * (2 << 20),
        source=CLIENT,
    )
    assert (big.status, big.json()["status"]) == (413, 413)
    _request_id(big.json(), seen)


def test_a_dead_upstream_is_a_502_envelope(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    base = stack.upstream.base
    try:
        reconfigure(stack, (f"proxy_pass {base}/;", "proxy_pass http://127.0.0.1:9/;"))
        answer = _get(stack, "/orders", key.headers)
        assert (answer.status, answer.json()["status"]) == (502, 502), answer.body
    finally:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))


# F3
API_HEADERS = {
    "Idempotency-Key": "order-7f3a",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=opaque",
    "X-Request-Id": "req-42",
    "Cache-Control": "no-cache",
    "Prefer": "return=minimal",
    "Origin": "https://app.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type",
}


@pytest.mark.parametrize(
    ("host", "validated"),
    [("API.example:8443", "api.example"), ('a";for="1.2.3.4', None), ("evil.example,a", None)],
)
def test_the_headers_api_clients_need_reach_the_upstream(
    stack: Stack, host: str, validated: str | None
) -> None:
    """The client's own X-Forwarded-Host and Forwarded are never forwarded, and its Host
    reaches the upstream only once nginx validated it: a hostile one sends no
    X-Forwarded-Host and no host= in Forwarded, whose one element stays nginx's."""
    key = stack.create_key(roles=["developer"])
    sent = {**key.headers, **API_HEADERS, "X-Forwarded-Host": "evil.example", "Host": host}
    sent["Forwarded"] = "for=10.0.0.1;host=evil.example"
    hits = len(stack.upstream.seen)
    assert _get(stack, "/orders", sent).status == 200
    [seen] = stack.upstream.seen[hits:]
    received = {name.lower(): value for name, value in seen["raw_headers"]}
    for name, value in API_HEADERS.items():
        assert received.get(name.lower()) == value, (name, received)
    # nginx's own view of the client, and of the host once validated; never the client's.
    assert received.get("x-forwarded-host") == validated
    element = {"for": CLIENT, "proto": "http", **({"host": validated} if validated else {})}
    assert seen["forwarded"] == [element], received.get("forwarded")
    assert "authorization" not in received


def test_with_the_allow_list_switched_off_the_secret_still_never_reaches_the_upstream(
    stack: Stack,
) -> None:
    """What an operator who writes `proxy_pass_request_headers on;` in location / gets:
    the client's other headers, but never its Authorization or Cookie, and keysvc's own
    headers stay keysvc's."""
    key = stack.create_key(roles=["developer"])
    upstream_location = "        proxy_pass_request_headers off;\n        # Who called"
    try:
        reconfigure(
            stack,
            (RATELIMIT_EXAMPLE, RATELIMIT_NAMED),
            (upstream_location, upstream_location.replace(" off;", " on;")),
        )
        forged = {
            **key.headers,
            "Cookie": "session=someone-else",
            "X-Key-Id": "forged",
            "X-Credits-Identity-Remaining": "1000000",
            "X-Custom": "kept",
        }
        hits = len(stack.upstream.seen)
        assert _get(stack, "/orders", forged).status == 200
        [seen] = stack.upstream.seen[hits:]
        received = {name.lower(): value for name, value in seen["raw_headers"]}
        assert received["x-custom"] == "kept"  # the flip took effect
        assert "authorization" not in received
        assert "cookie" not in received
        assert "x-credits-identity-remaining" not in received
        assert received["x-key-id"] == key.id
    finally:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))


# F2
def test_keysvc_s_503_reaches_the_client_with_its_retry_after(stack: Stack) -> None:
    """keysvc's database file moved away: a key with credits (a spend is a write) gets
    keysvc's 503 with Retry-After, not a 500."""
    key = stack.create_key(roles=["developer"], credits={"remaining": 100})
    assert _get(stack, "/orders", key.headers).status == 200
    db = stack.nginx.directory / "keysvc.db"
    away = db.with_name("keysvc-away.db")
    db.rename(away)
    try:
        time.sleep(1.2)  # past the reuse bound
        answer = _get(stack, "/orders", key.headers)
    finally:
        away.rename(db)
    assert answer.status == 503, answer.body
    assert answer.json()["status"] == 503
    retry_after = answer.headers["Retry-After"]
    assert retry_after is not None and int(retry_after) > 0


def test_a_frozen_keysvc_is_a_504_envelope_within_the_bound(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    hits = len(stack.upstream.seen)
    stack.keysvc.proc.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        connection = http.client.HTTPConnection(
            "127.0.0.1", stack.nginx.port, timeout=90, source_address=(CLIENT, 0)
        )
        try:
            connection.request("GET", "/orders", headers=key.headers)
            response = connection.getresponse()
            status, body = response.status, json.loads(response.read())
        finally:
            connection.close()
    finally:
        stack.keysvc.proc.send_signal(signal.SIGCONT)
    waited = time.monotonic() - started
    assert (status, body["status"]) == (504, 504), body
    assert 19 < waited < 40, waited
    assert len(stack.upstream.seen) == hits
    assert _get(stack, "/orders", key.headers).status == 200  # back once it answers


# F7
METHOD_BLIND = "map $uri $keysvc_path_permission {"


def test_the_method_aware_map_example_keeps_writes_from_a_read_permission(
    stack: Stack,
) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "nginx-auth-request.conf").read_text()
    start = text.index("# map $request_method:$uri")
    example = text[start : text.index("# }", start) + 3]
    uncommented = "\n".join(line.replace("# ", "", 1) for line in example.splitlines())
    shipped_start = text.index(METHOD_BLIND)
    shipped = text[shipped_start : text.index("\n}\n", shipped_start) + 2]
    role = stack.api("POST", "/roles", {"name": "reader", "permissions": ["reports:read"]})
    reader = stack.create_key(assignedRoleIds=[role["id"]])
    try:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED), (shipped, uncommented))
        assert _get(stack, "/reports/q1", reader.headers).status == 200
        assert _get(stack, "/reports/q1", reader.headers, "HEAD").status == 200
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            assert _get(stack, "/reports/q1", reader.headers, method).status == 403, method
    finally:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))


# F8
def test_the_access_log_holds_no_key_id_or_secret(stack: Stack) -> None:
    """The config's log_format, named by the http {} access_log after the config, as its
    comment says (the harness's own access_log, nginx's default format, taken out)."""
    directory = stack.nginx.directory
    default = f"    access_log {directory / 'access.log'};\n"
    ours = f"    access_log {directory / 'keysvc-access.log'} keysvc_access;\n"
    key = stack.create_key(roles=["developer"])
    try:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))
        conf = stack.nginx.conf.read_text()
        assert conf.count(default) == 1
        conf = conf.replace(default, "").removesuffix("}\n") + ours + "}\n"
        stack.nginx.stop()
        stack.nginx.conf.write_text(conf)
        stack.nginx.test_config()
        stack.nginx.start()
        assert _get(stack, "/orders", key.headers).status == 200
        assert _get(stack, "/reports/q1", key.headers).status == 403
    finally:
        reconfigure(stack, (RATELIMIT_EXAMPLE, RATELIMIT_NAMED))  # flushes the log
    log = (directory / "keysvc-access.log").read_text()
    assert "/orders" in log and "/reports/q1" in log
    assert key.key_id not in log
    assert key.secret not in log
    assert key.headers["Authorization"].split()[1] not in log
