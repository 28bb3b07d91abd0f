"""keysvc.client's middlewares against a real `keysvc serve`, where a request could pass
as someone else or be spent twice: a request without credentials is refused (keysvc's
401) without asking keysvc, even when the Verifier's session carries default
credentials (a session with ``auth=`` is refused when the Verifier is made); a request
with two Authorization headers is refused as keysvc refuses it, and one whose bytes are
not UTF-8 gets keysvc's own answer, not a 500; and verify goes as a
POST, which aiohttp does not send again when keysvc's answer is lost (a GET it does:
a key with credits was spent twice)."""

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
from multidict import CIMultiDict

from keysvc.client import Verifier
from tests.helpers import ClientFactory
from tests.middleware import Keysvc, aiohttp_service, running_keysvc, starlette_service
from tests.relay import Relay

UNAUTHORIZED = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"
TWO = "invalid credentials: send one Authorization header, not 2"


@pytest.fixture(scope="module")
def keysvc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keysvc]:
    yield from running_keysvc(tmp_path_factory.mktemp("keysvc"))


def assert_refused(status: int, body: Any, message: str) -> None:
    assert status == 401, body
    assert set(body) == {"status", "error", "requestId"}
    assert (body["status"], body["error"]) == (401, message)
    assert uuid.UUID(body["requestId"]).version == 4


async def test_a_request_without_credentials_never_passes_as_the_sessions_own(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    own = keysvc.admin.headers["Authorization"]
    async with aiohttp.ClientSession(headers={"Authorization": own}) as session:
        verifier = Verifier(keysvc.base, session=session)
        service = await aiohttp_client(aiohttp_service(verifier))
        before = keysvc.verified()
        for headers in ({}, {"Authorization": ""}):
            answer = await service.get("/reports", headers=headers)
            assert_refused(answer.status, await answer.json(), UNAUTHORIZED)
        assert keysvc.verified() == before  # refused without asking keysvc
        developer = keysvc.create_key(roles=["developer"])  # its own header, not the session's
        assert (await service.get("/", headers=developer.headers)).status == 200
        assert (await service.get("/reports", headers=developer.headers)).status == 403
    admin = keysvc.admin
    with pytest.warns(DeprecationWarning):  # aiohttp 4 drops auth=; 3.x still takes it
        basic = aiohttp.BasicAuth(admin.key_id, admin.secret)
        session = aiohttp.ClientSession(auth=basic)
    try:
        with pytest.raises(ValueError, match="credentials of its own"):
            Verifier(keysvc.base, session=session)
    finally:
        await session.close()


async def test_two_authorization_headers_are_refused_as_keysvc_refuses_them(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    admin = keysvc.admin.headers["Authorization"]
    two = [("Authorization", admin), ("Authorization", "Basic bm86b25l")]
    direct = await keysvc_answer(keysvc.base + "/v1/verify", two)
    assert_refused(*direct, TWO)  # keysvc's own answer
    verifier = Verifier(keysvc.base)
    try:
        service = await aiohttp_client(aiohttp_service(verifier))
        answer = await service.get("/", headers=CIMultiDict(two))
        assert_refused(answer.status, await answer.json(), TWO)
        transport = httpx.ASGITransport(app=starlette_service(verifier))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as asgi:
            refused = await asgi.get("/", headers=two)
            assert_refused(refused.status_code, refused.json(), TWO)
            missing = await asgi.get("/")
            assert_refused(missing.status_code, missing.json(), UNAUTHORIZED)
    finally:
        await verifier.close()


async def raw_get(port: int, authorization: bytes) -> tuple[int, Any]:
    """A GET of / with ``authorization`` as raw bytes (no client library sends these)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET / HTTP/1.1\r\nHost: service\r\nAuthorization: "
        + authorization
        + b"\r\nConnection: close\r\n\r\n"
    )
    head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    writer.close()
    return int(head.split()[1]), json.loads(body)


async def test_an_authorization_that_is_not_utf8_gets_keysvcs_answer_not_a_500(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    verifier = Verifier(keysvc.base)
    try:
        service = await aiohttp_client(aiohttp_service(verifier))
        before = keysvc.verified()
        for _ in range(2):  # a refusal is never kept: keysvc is asked each time
            status, body = await raw_get(service.port, b"Basic \xff\xfe")
            assert_refused(status, body, UNAUTHORIZED)
        assert keysvc.verified() - before == 2
    finally:
        await verifier.close()


async def keysvc_answer(url: str, headers: list[tuple[str, str]]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, headers=CIMultiDict(headers)) as answer,
    ):
        return answer.status, await answer.json()


async def test_a_lost_verify_answer_is_not_spent_again(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    plain = keysvc.create_key(roles=["developer"])
    metered = keysvc.create_key(roles=["developer"], credits={"remaining": 10})
    async with Relay(keysvc.server.port) as relay:
        verifier = Verifier(relay.base)
        try:
            service = await aiohttp_client(aiohttp_service(verifier))
            assert (await service.get("/", headers=plain.headers)).status == 200  # kept alive
            relay.drops = 1
            answer = await service.get("/", headers=metered.headers)
            assert answer.status == 503 and answer.headers["Retry-After"] == "1"
            assert relay.methods == ["POST", "POST"]
        finally:
            await verifier.close()
    assert keysvc.api("GET", f"/keys/{metered.id}")["credits"]["remaining"] == 9


def head_fields(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """A request head's line and its header fields (names in lower case), in order."""
    line, *fields = head.decode().split("\r\n")
    pairs = [field.split(":", 1) for field in fields]
    return line, [(name.lower(), value.strip()) for name, value in pairs]


async def test_verify_carries_the_callers_header_and_only_what_the_service_sets(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    """Whatever the client sends beside its Authorization (a claimed address, a
    requirement of its own, a cookie), verify's question holds the caller's header, the
    route's permission, the organization and the address the service saw, each once;
    a question asked again within the bound is not sent."""
    admin = keysvc.admin
    claims = {
        **admin.headers,
        "X-Forwarded-For": "10.0.0.9",
        "X-Required-Permission": "*",
        "X-Required-Organization": "someone-else",
        "Cookie": "session=x",
    }
    async with Relay(keysvc.server.port) as relay:
        at = relay.base
        verifier = Verifier(at, organization=admin.organization_id, forward_client_address=True)
        try:
            service = await aiohttp_client(aiohttp_service(verifier))
            for path in ("/", "/reports", "/", "/reports"):
                assert (await service.get(path, headers=claims)).status == 200
        finally:
            await verifier.close()
    asked = [head_fields(head) for head in relay.heads]
    assert [line for line, _ in asked] == ["POST /v1/verify HTTP/1.1"] * 2
    for (_, fields), permission in zip(asked, (None, "reports:read"), strict=True):
        names = [name for name, _ in fields]
        assert len(names) == len(set(names)), names
        expected = {
            "host": at.removeprefix("http://"),
            "authorization": admin.headers["Authorization"],
            "user-agent": "keysvc-client",
            "accept": "*/*",
            "x-required-organization": admin.organization_id,
            "x-forwarded-for": "127.0.0.1",
            "content-length": "0",
        }
        if permission is not None:
            expected["x-required-permission"] = permission
        sent = dict(fields)
        for own in ("accept-encoding", "content-type"):  # aiohttp's own, for any POST
            sent.pop(own)
        assert sent == expected
