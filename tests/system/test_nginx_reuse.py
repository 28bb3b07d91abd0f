"""The reuse bound through a real nginx running the shipped docs/nginx-auth-request.conf
(its proxy_cache on the auth subrequest) in front of a real `keysvc serve` with the
default KEYSVC_VERIFY_REUSE_SECONDS, 1 s: a verify answer is reused within the bound
(the reused requests never reach keysvc, by its request metrics), never for a key with a
request limit; and every change made through the API is seen through nginx within the
bound plus half a second: a key disabled, deleted or rotated without grace is refused,
a permission taken from its role is refused at the paths needing it, and a refused key
enabled passes. With keysvc stopped, no answer is served past its bound.
"""

import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Creds, hash_data
from tests.nginxstack import (
    BOUND,
    ENV,
    REUSE_SECONDS,
    WATCHED,
    Stack,
    early_in_a_second,
    start_stack,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("nginx-reuse"), ENV)


def seen_after(
    stack: Stack, path: str, creds: Creds, change: Callable[[], object]
) -> list[tuple[float, int]]:
    """Keep ``creds``'s answer at ``path`` in nginx's cache (the second and third of three
    requests in one second are served from it: keysvc never sees them), make ``change``,
    then request it without pause until the bound and WATCHED more seconds have passed
    (and five requests were made past the bound):
    each request's start, in seconds after ``change`` returned, and nginx's status."""
    for _ in range(5):  # three requests in one second, on a loaded machine: a few tries
        second = int(early_in_a_second())  # the answer kept now is served until its end
        first = stack.get(path, creds).status
        before = stack.verified()
        again = [stack.get(path, creds).status for _ in range(2)]
        if int(time.time()) == second:
            break
    else:
        pytest.fail("three requests never fitted in one second")
    assert again == [first, first]
    assert stack.verified() == before, "the priming requests were not served from the cache"
    change()
    changed = time.monotonic()
    seen: list[tuple[float, int]] = []
    late = 0
    # Until WATCHED seconds past the bound, and at least five requests started past it
    # (a loaded machine may take longer over each): what assert_within_the_bound reads.
    while (started := time.monotonic() - changed) < BOUND + WATCHED or late < 5:
        seen.append((started, stack.get(path, creds).status))
        late += started >= BOUND
    return seen


def assert_within_the_bound(seen: list[tuple[float, int]], status: int) -> None:
    """Every request started from the bound on was answered ``status``."""
    late = [answer for started, answer in seen if started >= BOUND]
    assert len(late) >= 5, seen  # enough requests to tell
    assert set(late) == {status}, [(round(t, 3), answer) for t, answer in seen if answer != status]


def test_the_shipped_config_keeps_a_cache_keyed_on_all_the_answer_depends_on() -> None:
    template = (
        Path(__file__).resolve().parents[2] / "docs" / "nginx-auth-request.conf"
    ).read_text()
    key = re.search(r'proxy_cache_key "([^"]*)";', template)
    assert key is not None
    covered = key[1].split("|")
    # The parts this file fixes and nginx's own client address first, then the one part
    # the client chooses, as a digest (no "|" in it): none can stand for another.
    assert covered == [
        "$keysvc_organization",
        "$keysvc_permission",
        "$keysvc_cost",
        "$keysvc_ratelimit",
        "$remote_addr",
        "$keysvc_credentials_digest",
    ]
    assert (
        "set_hmac_sha256 $keysvc_credentials_mac keysvc-nginx-cache-key $http_authorization;"
        in template
    )
    assert "set_encode_base64 $keysvc_credentials_digest $keysvc_credentials_mac;" in template
    # Exactly what the auth subrequest sends keysvc in the headers its answer reads,
    # and nothing of the client's besides.
    for header, value in (
        ("Authorization", "$http_authorization"),
        ("X-Required-Organization", "$keysvc_organization"),
        ("X-Required-Permission", "$keysvc_permission"),
        ("X-Credit-Cost", "$keysvc_cost"),
        ("X-Ratelimit", "$keysvc_ratelimit"),
        ("X-Forwarded-For", "$remote_addr"),
    ):
        assert f"proxy_set_header {header} {value};" in template
    assert "proxy_pass_request_headers off;" in template
    # Only keysvc's X-Accel-Expires decides what is kept, for how long.
    directives = [
        line.strip() for line in template.splitlines() if not line.strip().startswith("#")
    ]
    assert not [line for line in directives if line.startswith("proxy_cache_valid")]
    for directive in (
        "proxy_cache keysvc_verify;",
        "proxy_cache_lock on;",
        "proxy_cache_use_stale off;",
        "proxy_ignore_headers Cache-Control Expires Vary;",
    ):
        assert directive in directives


def test_a_200_is_reused_within_the_bound_and_asked_again_after(stack: Stack) -> None:
    # A long permission list: the answer nginx keeps carries a 3,000-character header.
    granted = sorted(f"svc{n:02d}:{'a' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": "wide", "permissions": granted})
    wide = stack.create_key(assignedRoleIds=[role["id"]])
    for _ in range(5):  # a whole second's requests, on a loaded machine: a few tries
        second = int(early_in_a_second())
        before, hits = stack.verified(), len(stack.upstream.seen)
        answers = [stack.get("/orders", wide) for _ in range(5)]
        if int(time.time()) == second:
            break
    else:
        pytest.fail("five requests never fitted in one second")
    assert [answer.status for answer in answers] == [200] * 5
    # Only the first reached keysvc; the upstream saw each, with the same identity.
    assert stack.verified() == before + 1
    assert len(stack.upstream.seen) == hits + 5
    for received in stack.upstream.seen[hits:]:
        assert received["headers"]["X-Key-Id"] == wide.id
        assert received["headers"]["X-Key-Permissions"].startswith(granted[0])
    # Past the bound the next request reaches keysvc again.
    while time.time() < second + REUSE_SECONDS + 0.05:
        time.sleep(0.02)
    assert stack.get("/orders", wide).status == 200
    assert stack.verified() == before + 2


def test_a_rate_limited_key_is_never_reused(stack: Stack) -> None:
    limited = stack.create_key(roles=["developer"], rateLimit={"limit": 1000, "windowSeconds": 60})
    early_in_a_second()
    before = stack.verified()
    answers = [stack.get("/orders", limited) for _ in range(10)]
    assert [answer.status for answer in answers] == [200] * 10
    assert stack.verified() == before + 10  # every request reached keysvc
    remaining = [answer.headers["X-RateLimit-Remaining"] for answer in answers]
    assert remaining == [str(999 - n) for n in range(10)]


def test_a_disabled_key_is_refused_within_the_bound(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    seen = seen_after(
        stack, "/orders", key, lambda: stack.api("PATCH", f"/keys/{key.id}", {"state": "disabled"})
    )
    assert_within_the_bound(seen, 401)


def test_a_deleted_key_is_refused_within_the_bound(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"])
    seen = seen_after(stack, "/orders", key, lambda: stack.api("DELETE", f"/keys/{key.id}"))
    assert_within_the_bound(seen, 401)


def test_a_key_rotated_without_grace_is_refused_within_the_bound(stack: Stack) -> None:
    old = stack.create_key(roles=["developer"])
    rotated: dict[str, Any] = {}

    def rotate() -> None:
        rotated.update(stack.api("POST", f"/keys/{old.id}/rotate", {"gracePeriodSeconds": 0}))

    seen = seen_after(stack, "/orders", old, rotate)
    assert_within_the_bound(seen, 401)
    new = Creds(old.organization_id, old.id, rotated["keyId"], rotated["keySecret"])
    assert stack.get("/orders", new).status == 200  # never seen before: no answer kept


def test_a_permission_taken_from_its_role_is_refused_within_the_bound(stack: Stack) -> None:
    role = stack.api("POST", "/roles", {"name": "reader", "permissions": ["reports:read"]})
    key = stack.create_key(assignedRoleIds=[role["id"]])
    assert stack.get("/reports/q1", key).status == 200

    def narrow() -> None:
        stack.api("PATCH", f"/roles/{role['id']}", {"permissions": ["orders:read"]})

    seen = seen_after(stack, "/reports/q1", key, narrow)
    assert_within_the_bound(seen, 403)
    assert stack.get("/orders", key).status == 200  # paths that need no permission still pass


def test_a_refused_key_enabled_passes_within_the_bound(stack: Stack) -> None:
    key = stack.create_key(roles=["developer"], state="disabled")
    assert stack.get("/orders", key).status == 401
    seen = seen_after(
        stack, "/orders", key, lambda: stack.api("PATCH", f"/keys/{key.id}", {"state": "enabled"})
    )
    assert_within_the_bound(seen, 200)


def test_no_answer_is_served_past_its_bound_with_keysvc_stopped(tmp_path: Path) -> None:
    with ExitStack() as resources:
        own = start_stack(resources, tmp_path, ENV)
        key = own.create_key(roles=["developer"])
        seen = seen_after(own, "/orders", key, own.keysvc.stop)
        assert_within_the_bound(seen, 503)


@pytest.mark.parametrize("length", [400, 1450])
def test_long_credentials_with_a_long_permission_list_are_reused(stack: Stack, length: int) -> None:
    # The Authorization header (here a key ID and secret of the client's own, up to
    # keysvc's 4,096 characters) goes into nginx's cache key, ahead of an answer with a
    # 3,000-character permissions header: both must fit the subrequest's buffer. With
    # nginx's default 4 KiB, the shorter was a 500 (too big a header), the longer never kept.
    granted = sorted(f"svc{n:02d}:{'b' * 113}" for n in range(40))
    role = stack.api("POST", "/roles", {"name": f"wide-{length}", "permissions": granted})
    key_id, secret = "k" * length, "s" * (length + 150)
    made = stack.api(
        "POST",
        "/keys",
        {"name": "own", "assignedRoleIds": [role["id"]], "hashData": hash_data(key_id, secret)},
    )
    own = Creds(stack.admin.organization_id, made["key"]["id"], key_id, secret)
    assert len(own.headers["Authorization"]) > 2.6 * length
    for _ in range(5):
        second = int(early_in_a_second())
        before = stack.verified()
        answers = [stack.get("/orders", own) for _ in range(3)]
        if int(time.time()) == second:
            break
    assert [answer.status for answer in answers] == [200] * 3, stack.nginx.log()[-2000:]
    assert stack.verified() == before + 1
    assert "[error]" not in stack.nginx.log(), stack.nginx.log()[-2000:]


def test_a_key_given_credits_spends_from_within_the_bound(stack: Stack) -> None:
    # docs/concepts/credits.md, "Spending": a key's answer kept before it had credits is
    # still served for up to the bound; every request from then on reaches keysvc and spends.
    key = stack.create_key(roles=["developer"])

    def give() -> None:
        stack.api("POST", f"/keys/{key.id}/credits", {"set": 1000})

    seen = seen_after(stack, "/orders", key, give)
    assert_within_the_bound(seen, 200)
    spent = 1000 - stack.api("GET", f"/keys/{key.id}")["credits"]["remaining"]
    late = [started for started, _ in seen if started >= BOUND]
    assert len(late) <= spent <= len(seen)
