"""The hostile review of issue 37's import (rt37), through the real app on both
backends: what a tenant's import may cost everyone else, and what a record's fields
make of the key, compared with a create."""

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.domain import imports
from keysvc.http.state import STORE
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    client_with,
    count_statements,
    create,
    get_key,
    ip_list,
    keys_url,
)

# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default,
# tests/api/test_import_tokens_off.py).
pytestmark = pytest.mark.settings(api_token_import=True)

BURST = {"name": "burst", "limit": 10, "windowSeconds": 1, "autoApply": True}
TOKENS = {"name": "tokens", "limit": 100000, "windowSeconds": 60, "autoApply": False}


def _record(import_id: str, **fields: Any) -> dict[str, Any]:
    digest = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()
    token = {"algorithm": "sha256", "encoding": "hex", "value": digest}
    return {
        "importId": import_id,
        "name": import_id,
        "roles": ["developer"],
        "tokenHash": token,
        **fields,
    }


def _import_url(caller: Creds) -> str:
    return keys_url(caller) + "/import"


def _written(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store's write transactions run from now on (the requests'
    own: ``count_statements``), whichever connection each is given."""
    seen: list[str] = []
    original = store.transaction

    @contextlib.asynccontextmanager
    async def counted(operation: str, timed: bool = True) -> AsyncIterator[Any]:
        async with original(operation, timed) as conn:
            with monkeypatch.context() as patch:
                here = count_statements(conn, patch)
                try:
                    yield conn
                finally:
                    seen.extend(here)

    monkeypatch.setattr(store, "transaction", counted)
    return seen


async def test_an_import_past_the_write_budget_is_refused_before_any_key_is_written(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # F1: a refused import held the one write lock as long as an accepted one (it
    # wrote its thousand keys, then its activity's charge refused it and rolled back),
    # so a tenant past its budget still delayed every other tenant's revocations.
    client = await client_with(
        aiohttp_client, settings, clock, org_write_budget_mib=1, max_keys_per_org=100_000
    )
    admin = await bootstrap(client.app)
    victim = await bootstrap(client.app, "victim")
    target = (await create(client, victim, {"name": "t", "roles": ["developer"]}))["key"]["id"]
    status, batches = 200, 0
    while status == 200:  # each key's activity keeps its 100 described networks: ~30 KB
        assert batches < 10, "the 1 MiB budget never ran out"
        body = {"keys": [_record(f"b{batches}-{n}", ipAccessList=ip_list("a")) for n in range(20)]}
        response = await client.post(_import_url(admin), json=body, headers=admin.headers)
        status, batches = response.status, batches + 1
        await response.read()
    assert status == 429
    statements = _written(client.app[STORE], monkeypatch)
    # As large as the one refused: the refusal rolled its own charge back.
    body = {"keys": [_record(f"late-{n}", ipAccessList=ip_list("a")) for n in range(20)]}
    response = await client.post(_import_url(admin), json=body, headers=admin.headers)
    assert response.status == 429, await response.text()
    assert response.headers.get("Retry-After")
    inserts = [s for s in statements if s.lower().startswith("insert into api_keys")]
    assert inserts == [], "a refused import wrote its keys before it was refused"
    # The owner's recovery is never refused (and the other tenant's either).
    disable = await client.patch(
        keys_url(victim, target), json={"state": "disabled"}, headers=victim.headers
    )
    assert (await assert_ok(disable))["state"] == "disabled"


async def test_an_imported_record_keeps_its_named_rate_limits_as_a_create_does(
    client: Client, admin: Creds
) -> None:
    # F2: ``ratelimits`` (issue 36) was accepted and dropped without a word.
    body = {"keys": [_record("limited", ratelimits=[TOKENS, BURST]), _record("free")]}
    result = await assert_ok(
        await client.post(_import_url(admin), json=body, headers=admin.headers)
    )
    assert (result["imported"], result["errors"]) == (2, [])
    made = {k["importId"]: k["id"] for k in result["keys"]}
    assert (await get_key(client, admin, made["limited"]))["ratelimits"] == [TOKENS, BURST]
    assert "ratelimits" not in await get_key(client, admin, made["free"])
    created = await create(
        client, admin, {"name": "c", "roles": ["developer"], "ratelimits": [TOKENS, BURST]}
    )
    assert created["key"]["ratelimits"] == [TOKENS, BURST]


async def test_an_organizations_imports_wait_for_the_writer_one_at_a_time(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # F5: each of a tenant's concurrent imports queued for the one writer, so another
    # tenant's write (a revocation too) waited behind all of them: p50 8.5 s with six.
    store = client.app[STORE]
    original = store.transaction
    queued = [0, 0]  # imports waiting for or in a write transaction; the most at once
    first = asyncio.Event()

    @contextlib.asynccontextmanager
    async def observed(operation: str, timed: bool = True) -> AsyncIterator[Any]:
        counted = operation == "import_keys"
        queued[0] += counted
        queued[1] = max(queued)
        try:
            async with original(operation, timed) as conn:
                if counted and not first.is_set():
                    first.set()
                    await asyncio.sleep(1)  # the others arrive meanwhile
                yield conn
        finally:
            queued[0] -= counted

    monkeypatch.setattr(store, "transaction", observed)

    async def send(prefix: str) -> int:
        body = {"keys": [_record(f"{prefix}-{n}") for n in range(100)]}
        response = await client.post(_import_url(admin), json=body, headers=admin.headers)
        await response.read()
        return response.status

    assert await asyncio.gather(*(send(f"a{n}") for n in range(4))) == [200] * 4
    assert queued == [0, 1]


async def test_an_import_waiting_too_long_for_its_organizations_last_is_a_503(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock of the test above must not make a hang of a slow database: a wait past
    # IMPORT_WAIT_SECONDS is a 503 with Retry-After, as the store's own waits are.
    monkeypatch.setattr(imports, "IMPORT_WAIT_SECONDS", 0.2)
    store = client.app[STORE]
    original = store.transaction
    inside = asyncio.Event()

    @contextlib.asynccontextmanager
    async def slow(operation: str, timed: bool = True) -> AsyncIterator[Any]:
        async with original(operation, timed) as conn:
            if operation == "import_keys" and not inside.is_set():
                inside.set()
                await asyncio.sleep(1.5)  # a database that is slow to answer
            yield conn

    monkeypatch.setattr(store, "transaction", slow)
    url, headers = _import_url(admin), admin.headers
    first = asyncio.ensure_future(client.post(url, json={"keys": [_record("a")]}, headers=headers))
    await asyncio.wait_for(inside.wait(), 30)
    second = await client.post(url, json={"keys": [_record("b")]}, headers=headers)
    await assert_error(second, 503, imports.IMPORT_WAITED)
    assert second.headers["Retry-After"] == "5"
    assert (await assert_ok(await first))["imported"] == 1
