"""What a verify's 200 makes once rather than on every request (issue 36's plain-verify
target, docs/PERFORMANCE.md "Round 3 (h36/plain3)"), through the real app on both
backends: the key's headers are made once per cached key, the answer's headers once a
second; the header's proof is hashed without hmac.HMAC's Python layer; a key's one
autoApply limit is counted on SQLite without awaiting the limiter. The answers
themselves are unchanged (tests/api/test_verify*.py)."""

import hmac
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from keysvc.domain.ratelimit import Limits
from keysvc.http import render
from tests.helpers import Client, Creds, FakeClock, create_creds

VERIFY = "/v1/verify"


class Calls:
    """How many times a wrapped function ran (it still does its work)."""

    def __init__(self) -> None:
        self.count = 0


@pytest.fixture
def quoted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    calls = Calls()
    made = render.external_id_header

    def counted(external_id: str) -> str:
        calls.count += 1
        return made(external_id)

    monkeypatch.setattr(render, "external_id_header", counted)
    yield calls


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
