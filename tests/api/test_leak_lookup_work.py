"""``Store.keys_with_secret`` does the same work for a hit as for a miss, on both
backends: the same statements, and one constant-time compare of the secret's keyed hash
(against the key's, or an absent one)."""

import hmac
from typing import Any

import pytest

from keysvc.http.state import CLOCK, HASHER, STORE
from tests.helpers import Client, Creds, count_statements, create_creds

MISS = "keysvc_" + "A" * 42


async def test_a_hit_and_a_miss_do_the_same_work(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = client.app
    store, hasher = app[STORE], app[HASHER]
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    real = hmac.compare_digest
    work: dict[str, tuple[list[str], int, int]] = {}
    for name, secret in (("hit", made.secret), ("miss", MISS)):
        offered = hasher.of_plain(secret)
        compares: list[Any] = []

        def counted(a: Any, b: Any, _offered: bytes = offered, _seen: list[Any] = compares) -> bool:
            if a == _offered:  # this lookup's own compares, no other task's
                _seen.append(b)
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", counted)
        async with store.transaction("test") as conn:
            seen = count_statements(conn, monkeypatch)
            holders = await store.keys_with_secret(conn, offered, app[CLOCK]())
        monkeypatch.setattr(hmac, "compare_digest", real)
        work[name] = (list(seen), len(compares), len(holders))
    assert work["hit"][2] == 1 and work["hit"][0][0] == work["miss"][0][0]
    assert work["miss"][2] == 0
    assert work["hit"][:2] == work["miss"][:2]
    # One read of the keys by the hash and one of their roles (besides the transaction's
    # own begin and commit, where the backend runs them as statements); one compare.
    reads = [s for s in work["hit"][0] if s.split()[0].lower() not in ("begin", "commit")]
    assert len(reads) == 2 and work["hit"][1] == 1
