"""What a verify's 200 makes once rather than on every request (issue 36's plain-verify
target, docs/PERFORMANCE.md "Round 3 (h36/plain3)"), through the real app on both
backends: the key's headers are made once per cached key, the answer's headers once a
second; the header's proof is hashed without hmac.HMAC's Python layer; a key's one
autoApply limit is counted on SQLite without awaiting the limiter; a warm verify
spending its identity's credits reads the identity without an await and its spend's
answer without a shield. The answers themselves are unchanged (tests/api/test_verify*.py,
tests/api/test_identities_credits.py)."""

import asyncio
import hmac
import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from keysvc.db.identities import IdentityStore
from keysvc.domain import keycredits
from keysvc.domain.ratelimit import Limits
from keysvc.http import render
from keysvc.http.state import HASHER, STORE
from tests.helpers import Client, Creds, FakeClock, create_creds

VERIFY = "/v1/verify"


class Calls:
    """How many times a wrapped function ran (it still does its work)."""

    def __init__(self) -> None:
        self.count = 0


def counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> Calls:
    """Count the calls of ``owner``'s ``name`` (a function, or a coroutine function,
    which is then counted as it is awaited), each still doing its work."""
    calls = Calls()
    original = getattr(owner, name)
    if inspect.iscoroutinefunction(original):

        async def counted_async(*args: Any, **kwargs: Any) -> Any:
            calls.count += 1
            return await original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted_async)
    else:

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.count += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.fixture
def quoted(monkeypatch: pytest.MonkeyPatch) -> Calls:
    return counting(monkeypatch, render, "external_id_header")


async def test_a_keys_headers_are_made_once_for_its_verifies(
    client: Client, admin: Creds, clock: FakeClock, quoted: Calls
) -> None:
    body = {"name": "svc", "roles": ["developer"], "externalId": "user 42%"}
    key = await create_creds(client, admin, body)
    second = int(clock.now.timestamp()) + 10
    answers = []
    for fraction in (0.1, 0.5, 1.2):  # across a second: new reuse headers, same key headers
        clock.now = datetime.fromtimestamp(second + fraction, UTC)
        answer = await client.get(VERIFY, headers=key.headers)
        assert answer.status == 200
        answers.append(answer.headers)
    assert quoted.count == 1
    for headers in answers:
        assert headers["X-Key-Id"] == key.id
        assert headers["X-Organization-Id"] == admin.organization_id
        assert headers["X-Key-External-Id"] == "user 42%25"
    assert answers[0]["X-Accel-Expires"] == answers[1]["X-Accel-Expires"]
    assert answers[2]["X-Accel-Expires"] != answers[0]["X-Accel-Expires"]


async def test_a_proof_is_hashed_without_the_python_hmac_layer(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = Calls()
    copy = hmac.HMAC.copy

    def counted(self: hmac.HMAC) -> hmac.HMAC:
        copies.count += 1
        return copy(self)

    monkeypatch.setattr(hmac.HMAC, "copy", counted)
    for _ in range(3):
        answer = await client.get(VERIFY, headers=admin.headers)
        assert answer.status == 200
    assert copies.count == 0


async def test_one_auto_apply_limit_is_counted_without_awaiting_the_limiter(
    client: Client, admin: Creds, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    awaited = Calls()
    named = Limits.named

    async def counted(self: Limits, *args: object) -> object:
        awaited.count += 1
        return await named(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Limits, "named", counted)
    limit = {"name": "burst", "limit": 2, "windowSeconds": 60, "autoApply": True}
    body = {"name": "limited", "roles": ["developer"], "ratelimits": [limit]}
    key = await create_creds(client, admin, body)
    statuses = [(await client.get(VERIFY, headers=key.headers)).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    # PostgreSQL shares the counts with the other instances: awaited there.
    assert awaited.count == (0 if backend == "sqlite" else 3)


@pytest.fixture
def facts_read(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The awaited reads of an identity's facts (``IdentityStore._facts``)."""
    return counting(monkeypatch, IdentityStore, "_facts")


async def _identity_key(client: Client, admin: Creds, external_id: str, remaining: int) -> Creds:
    identities = f"/v1/organizations/{admin.organization_id}/identities"
    body = {"externalId": external_id, "credits": {"remaining": remaining}}
    created = await client.post(identities, json=body, headers=admin.headers)
    assert created.status == 200  # as the upstream's createIdentity
    key_body = {"name": "k", "roles": ["developer"], "externalId": external_id}
    return await create_creds(client, admin, key_body)


async def test_a_warm_identity_verify_reads_its_identity_without_an_await(
    client: Client, admin: Creds, facts_read: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its identity's facts are cached, a verify of a key spending its identity's
    credits neither awaits them (twice a verify on the old code: for its limits and for
    its credits) nor makes a credit event's data when no event is sent."""
    events = counting(monkeypatch, keycredits, "credits_json")
    key = await _identity_key(client, admin, "warm", 100)
    assert (await client.get(VERIFY, headers=key.headers)).status == 200  # warms the cache
    facts_read.count = events.count = 0
    for remaining in (98, 97, 96):
        answer = await client.get(VERIFY, headers=key.headers)
        assert answer.status == 200
        assert answer.headers["X-Credits-Identity-Remaining"] == str(remaining)
    assert (facts_read.count, events.count) == (0, 0)


async def test_a_spend_whose_caller_went_away_is_made_and_not_answered(
    client: Client, admin: Creds
) -> None:
    """Without the shield, a verify cancelled while its spend waits for its batch leaves
    the spend to the batch (made, not acknowledged), and the batch answers the others."""
    key = await _identity_key(client, admin, "gone", 10)
    assert (await client.get(VERIFY, headers=key.headers)).status == 200  # 9 left, warm
    store = client.app[STORE]
    caller = store.proven_credential(client.app[HASHER].of_header(key.headers["Authorization"]))
    assert caller is not None
    now = datetime.now(UTC)
    gone = asyncio.create_task(keycredits.spend(store, caller.key, 1, now))
    kept = asyncio.create_task(keycredits.spend(store, caller.key, 1, now))
    await asyncio.sleep(0)  # both are waiting for their batch
    gone.cancel()
    answer = await kept
    assert answer is not None and answer.identity is not None and answer.identity.allowed
    with pytest.raises(asyncio.CancelledError):
        await gone
    checked = await client.get(VERIFY, headers=key.headers)
    assert checked.status == 200
    # 9, less the two spends of the batch, less this verify's.
    assert checked.headers["X-Credits-Identity-Remaining"] == "6"
