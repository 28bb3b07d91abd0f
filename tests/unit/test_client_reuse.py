"""keysvc.client's reuse rules without a server: how long keysvc's reuse headers let an
answer be kept, the digest that keys it, and the bounded store."""

import pytest

from keysvc.client.records import caller_from_headers
from keysvc.client.reuse import ReuseStore, digest, reuse_seconds

NOW = 1_800_000_000.25


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Cache-Control": "private, max-age=1", "X-Accel-Expires": f"@{int(NOW)}"}, 1.0),
        ({"Cache-Control": "private, max-age=30"}, 30.0),
        ({"Cache-Control": "no-store", "X-Accel-Expires": "0"}, 0.0),
        ({"Cache-Control": "private, max-age=5", "X-Accel-Expires": "0"}, 0.0),
        ({"Cache-Control": "private"}, 0.0),
        ({"X-Accel-Expires": f"@{int(NOW)}"}, 0.75),
        ({"X-Accel-Expires": f"@{int(NOW) - 1}"}, 0.0),
        ({"X-Accel-Expires": "3"}, 3.0),
        ({"X-Accel-Expires": "soon"}, 0.0),
        ({}, 0.0),
    ],
)
def test_an_answer_is_kept_only_as_long_as_its_headers_allow(
    headers: dict[str, str], seconds: float
) -> None:
    assert reuse_seconds(headers, NOW) == seconds


def test_the_digest_tells_every_input_apart() -> None:
    seen = {
        digest("Basic a", "bc", None, None),
        digest("Basic ab", "c", None, None),
        digest("Basic a", "bc", "", None),
        digest("Basic a", "bc", None, ""),
        digest("Basic a", None, "bc", None),
    }
    assert len(seen) == 5
    assert b"Basic" not in digest("Basic a", None, None, None)


def test_the_store_keeps_until_the_deadline_and_drops_the_least_recently_used() -> None:
    store: ReuseStore[str] = ReuseStore(2)
    store.put(b"a", "A", deadline=10)
    store.put(b"b", "B", deadline=10)
    assert store.get(b"a", now=5) == "A"  # a is now the most recently used
    store.put(b"c", "C", deadline=10)
    assert (store.get(b"b", 5), store.get(b"a", 5), store.get(b"c", 5)) == (None, "A", "C")
    assert store.get(b"a", now=10) is None and len(store) == 1
    nothing: ReuseStore[str] = ReuseStore(0)
    nothing.put(b"a", "A", deadline=10)
    assert len(nothing) == 0


def test_a_caller_read_from_headers_follows_every_value_it_is_read_from() -> None:
    """Callers are kept by their header values: the same values give the same caller,
    and any value changed (a permission, the credits left) gives a new one."""
    headers = {
        "X-Key-Id": "k1",
        "X-Organization-Id": "o1",
        "X-Key-Permissions": "keys:read,roles:read",
        "X-Key-External-Id": "user%207",
    }
    first = caller_from_headers(headers)
    assert caller_from_headers(dict(headers)) is first
    assert (first.permissions, first.external_id) == ({"keys:read", "roles:read"}, "user 7")
    fewer = caller_from_headers({**headers, "X-Key-Permissions": "keys:read"})
    assert fewer.permissions == {"keys:read"} and not fewer.may("roles:read")
    spent = [caller_from_headers({**headers, "X-Credits-Remaining": n}) for n in ("2", "1")]
    assert [caller.credits_remaining for caller in spent] == [2, 1]
    assert caller_from_headers({**headers, "X-Key-Id": "k2"}).key_id == "k2"
