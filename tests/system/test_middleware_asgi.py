"""keysvc.client's ASGI middleware in front of a Starlette app (from PyPI, as FastAPI
builds on it), driven through httpx's ASGI transport, checking each request with a real
`keysvc serve` (KEYSVC_VERIFY_REUSE_SECONDS at its default, 1 s): the endpoint reads the
caller from ``request.state.keysvc`` (and the scope's ``keysvc``); keysvc's refusals
reach the client as keysvc gave them, keysvc unreachable is a 503 with Retry-After; a
key disabled through the API is refused within the bound, and a key with credits is
verified and spent on every request."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from keysvc.client import KeysvcMiddleware, Verifier
from tests.helpers import Creds
from tests.middleware import Keysvc, running_keysvc, starlette_service
from tests.server import free_port

BOUND = 1 + 0.5  # keysvc's default reuse bound, and the margin tests/system give nginx


@pytest.fixture(scope="module")
def keysvc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keysvc]:
    yield from running_keysvc(tmp_path_factory.mktemp("keysvc"))


@pytest.fixture
async def verifier(keysvc: Keysvc) -> AsyncIterator[Verifier]:
    made = Verifier(keysvc.base, organization=keysvc.admin.organization_id)
    yield made
    await made.close()


def service_client(verifier: Verifier) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=starlette_service(verifier))
    return httpx.AsyncClient(transport=transport, base_url="http://service")


async def get(client: httpx.AsyncClient, path: str, creds: Creds | None) -> httpx.Response:
    return await client.get(path, headers=creds.headers if creds else {})


async def test_the_endpoint_reads_the_caller_and_refusals_pass_as_keysvc_gave_them(
    keysvc: Keysvc, verifier: Verifier
) -> None:
    caller = keysvc.create_key(roles=["developer"], externalId="user-8")
    async with service_client(verifier) as client:
        answer = await get(client, "/", caller)
        assert answer.status_code == 200, answer.text
        assert answer.json()["keyId"] == caller.id
        assert answer.json()["permissions"] == ["keys:read", "roles:read"]
        assert answer.json()["externalId"] == "user-8"
        refused = await get(client, "/reports", caller)
        assert refused.status_code == 403
        assert refused.json()["error"] == "this key lacks the permission reports:read"
        assert uuid.UUID(refused.json()["requestId"]).version == 4
        anonymous = await get(client, "/", None)
        assert anonymous.status_code == 401 and anonymous.json()["status"] == 401


async def test_keysvc_unreachable_is_a_503_with_retry_after(keysvc: Keysvc) -> None:
    nowhere = Verifier(f"http://127.0.0.1:{free_port()}")
    try:
        async with service_client(nowhere) as client:
            answer = await get(client, "/", keysvc.admin)
        assert (answer.status_code, answer.headers["Retry-After"]) == (503, "1")
        assert answer.json()["error"] == "keysvc unavailable: try again later"
    finally:
        await nowhere.close()


async def test_a_disabled_key_is_refused_within_the_bound(
    keysvc: Keysvc, verifier: Verifier
) -> None:
    caller = keysvc.create_key(roles=["developer"])
    async with service_client(verifier) as client:
        assert (await get(client, "/", caller)).status_code == 200
        keysvc.api("PATCH", f"/keys/{caller.id}", {"state": "disabled"})
        disabled = time.monotonic()
        while (await get(client, "/", caller)).status_code == 200:
            assert time.monotonic() - disabled <= BOUND, "still served past keysvc's bound"
            await asyncio.sleep(0.02)
        assert (await get(client, "/", caller)).json()["error"] == "key is disabled"


async def test_a_key_with_credits_is_verified_and_spent_on_every_request(
    keysvc: Keysvc, verifier: Verifier
) -> None:
    caller = keysvc.create_key(roles=["developer"], credits={"remaining": 2})
    before = keysvc.verified()
    async with service_client(verifier) as client:
        spent = [(await get(client, "/", caller)).json()["creditsRemaining"] for _ in range(2)]
        assert spent == [1, 0]
        assert (await get(client, "/", caller)).status_code == 429
    assert keysvc.verified() - before == 3
    assert keysvc.api("GET", f"/keys/{caller.id}")["credits"]["remaining"] == 0


async def test_a_refused_websocket_is_closed_before_it_is_accepted(
    keysvc: Keysvc, verifier: Verifier
) -> None:
    """httpx speaks no websocket: the ASGI app is called as a server would call it."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app was called for a refused websocket")

    middleware = KeysvcMiddleware(never, verifier=verifier)
    scope = {"type": "websocket", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}
    await middleware(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert "keysvc" not in scope
