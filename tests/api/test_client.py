"""keysvc.client against the real app on a real socket (the test server's loopback
port): every call of the async client and of the sync one (run in a thread, as code
without an event loop runs it), each test once per client, and the envelope's errors
raised as exceptions that carry the status, the message and the answer's requestId."""

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from keysvc.client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    KeysvcError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from tests.helpers import Client as TestClient
from tests.helpers import Creds, create_creds
from tests.relay import Relay
from tests.server import free_port

UNAUTHORIZED = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"


class Either:
    """The async or the sync client, awaited alike: the sync one runs in a thread."""

    def __init__(self, kind: str, base: str, key_id: str, secret: str) -> None:
        self.sync, self.kind, self.client_base = kind == "sync", kind, base
        maker = Client if self.sync else AsyncClient
        self.client: Any = maker(base, key_id, secret)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.sync:
                return await asyncio.to_thread(method, *args, **kwargs)
            return await method(*args, **kwargs)

        return call

    async def every_key(self, organization_id: str, limit: int) -> list[Any]:
        if self.sync:
            return await asyncio.to_thread(
                lambda: list(self.client.iter_keys(organization_id, limit=limit))
            )
        return [key async for key in self.client.iter_keys(organization_id, limit=limit)]

    async def aclose(self) -> None:
        if self.sync:
            self.client.close()
        else:
            await self.client.close()


@pytest.fixture(params=["async", "sync"])
async def keysvc(request: pytest.FixtureRequest, client: TestClient, admin: Creds) -> Any:
    either = Either(request.param, str(client.make_url("")), admin.key_id, admin.secret)
    yield either
    await either.aclose()


def assert_refused(error: KeysvcError, kind: type[KeysvcError], status: int, message: str) -> None:
    assert type(error) is kind
    assert (error.status, error.message) == (status, message)
    assert error.request_id is not None
    assert str(uuid.UUID(error.request_id)) == error.request_id


async def test_every_key_call_round_trips(keysvc: Either, admin: Creds) -> None:
    org = admin.organization_id
    created = await keysvc.create_key(org, {"name": "svc", "roles": ["developer"]})
    assert set(created) >= {"key", "keyId", "keySecret"}
    key_id = created["key"]["id"]
    tagged = await keysvc.get_key(org, key_id)
    assert tagged.value["name"] == "svc" and tagged.etag
    renamed = await keysvc.update_key(org, key_id, {"name": "renamed"}, if_match=tagged.etag)
    assert renamed.value["name"] == "renamed" and renamed.etag != tagged.etag
    with pytest.raises(Conflict) as stale:
        await keysvc.update_key(org, key_id, {"name": "again"}, if_match=tagged.etag)
    assert stale.value.status == 412 and stale.value.request_id
    credited = await keysvc.change_credits(org, key_id, {"set": 5})
    assert credited.value["credits"]["remaining"] == 5
    rotated = await keysvc.rotate_key(org, key_id)
    assert rotated["keyId"] != created["keyId"]
    usage = await keysvc.key_usage(org, key_id, {"granularity": "day"})
    assert usage["granularity"] == "day"
    first = await keysvc.list_keys(org, limit=1)
    assert len(first.items) == 1 and first.next_cursor and first.total_count == 2
    second = await keysvc.list_keys(org, limit=1, cursor=first.next_cursor)
    assert [k["id"] for k in second.items] == [key_id] and second.next_cursor is None
    assert [k["id"] for k in await keysvc.every_key(org, 1)] == [admin.id, key_id]
    await keysvc.delete_key(org, key_id)
    with pytest.raises(NotFound) as gone:
        await keysvc.get_key(org, key_id)
    assert_refused(gone.value, NotFound, 404, "key not found in this organization")


async def test_every_role_call_and_whoami(keysvc: Either, admin: Creds) -> None:
    org = admin.organization_id
    role = await keysvc.create_role(org, {"name": "reports", "permissions": ["reports:read"]})
    assert (await keysvc.get_role(org, role["id"]))["name"] == "reports"
    changed = await keysvc.update_role(org, role["id"], {"permissions": ["reports:write"]})
    assert "reports:write" in changed["permissions"]
    page = await keysvc.list_roles(org, limit=100)
    assert role["id"] in {r["id"] for r in page.items}
    await keysvc.delete_role(org, role["id"])
    with pytest.raises(NotFound):
        await keysvc.get_role(org, role["id"])
    me = await keysvc.whoami()
    assert (me["id"], me["organizationId"]) == (admin.id, org)


async def test_verify_names_the_caller(keysvc: Either, client: TestClient, admin: Creds) -> None:
    org = admin.organization_id
    caller = await create_creds(
        client,
        admin,
        {"name": "svc", "roles": ["developer"], "externalId": "user-1", "meta": {"plan": "pro"}},
    )
    header = caller.headers["Authorization"]
    plain = await keysvc.verify(header, permission="keys:read", organization=org)
    assert (plain.key_id, plain.organization_id) == (caller.id, org)
    assert plain.permissions == {"keys:read", "roles:read"}
    assert (plain.external_id, plain.meta, plain.identity) == ("user-1", None, None)
    full = await keysvc.verify(header, full=True)
    assert (full.name, full.meta, full.external_id) == ("svc", {"plan": "pro"}, "user-1")
    with pytest.raises(Forbidden) as refused:
        await keysvc.verify(header, permission="keys:delete")
    assert refused.value.status == 403 and refused.value.request_id
    with pytest.raises(Unauthorized) as unknown:
        await keysvc.verify("Basic bm8tc3VjaDprZXk=")
    assert_refused(unknown.value, Unauthorized, 401, UNAUTHORIZED)


async def test_refusals_raise_their_family(
    keysvc: Either, client: TestClient, admin: Creds
) -> None:
    org = admin.organization_id
    with pytest.raises(BadRequest) as bad:
        await keysvc.create_key(org, {"name": "x", "colour": "red"})
    assert bad.value.status == 400 and "colour" in bad.value.message
    reader = await create_creds(client, admin, {"name": "reader", "roles": ["developer"]})
    weak = Either(keysvc.kind, keysvc.client_base, reader.key_id, reader.secret)
    try:
        with pytest.raises(Forbidden) as forbidden:
            await weak.create_key(org, {"name": "nope"})
        assert forbidden.value.status == 403 and forbidden.value.request_id
    finally:
        await weak.aclose()
    spent = await create_creds(
        client, admin, {"name": "spent", "roles": ["developer"], "credits": {"remaining": 0}}
    )
    with pytest.raises(RateLimited) as exhausted:
        await keysvc.verify(spent.headers["Authorization"])
    assert exhausted.value.status == 429 and exhausted.value.request_id
    limited = await create_creds(
        client,
        admin,
        {"name": "limited", "roles": ["developer"], "rateLimit": {"limit": 1, "windowSeconds": 60}},
    )
    await keysvc.verify(limited.headers["Authorization"])
    with pytest.raises(RateLimited) as over:
        await keysvc.verify(limited.headers["Authorization"])
    assert over.value.status == 429 and over.value.retry_after and over.value.retry_after > 0


async def test_wrong_secret_is_unauthorized(
    keysvc: Either, client: TestClient, admin: Creds
) -> None:
    wrong = Either(keysvc.kind, keysvc.client_base, admin.key_id, "x" * 40)
    try:
        with pytest.raises(Unauthorized) as refused:
            await wrong.whoami()
        assert_refused(refused.value, Unauthorized, 401, UNAUTHORIZED)
    finally:
        await wrong.aclose()


async def test_unreachable_keysvc_is_unavailable(keysvc: Either) -> None:
    nowhere = Either(keysvc.kind, f"http://127.0.0.1:{free_port()}", "a", "b")
    try:
        with pytest.raises(Unavailable) as down:
            await nowhere.whoami()
        assert down.value.status == 503 and down.value.request_id is None
    finally:
        await nowhere.aclose()


async def test_the_external_id_reads_back_as_it_was_set(
    keysvc: Either, client: TestClient, admin: Creds
) -> None:
    """keysvc sends X-Key-External-Id percent-encoded (UTF-8): the caller's is decoded,
    so "café" and the literal "caf%C3%A9" stay two IDs, each read back as set."""
    for external_id in ("café", "caf%C3%A9"):
        made = await create_creds(
            client, admin, {"name": "x", "roles": ["developer"], "externalId": external_id}
        )
        for full in (False, True):
            caller = await keysvc.verify(made.headers["Authorization"], full=full)
            assert caller.external_id == external_id, (full, caller.external_id)


async def test_may_answers_as_keysvc_does(keysvc: Either, client: TestClient, admin: Creds) -> None:
    """Caller.may holds a permission as keysvc's verify does: itself, ``*`` (the admin)
    or its namespace's ``ns:*``."""
    org = admin.organization_id
    role = await keysvc.create_role(org, {"name": "reports-all", "permissions": ["reports:*"]})
    namespace = await create_creds(
        client, admin, {"name": "ns", "roles": ["developer"], "assignedRoleIds": [role["id"]]}
    )
    developer = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    asked = ["reports:read", "reports:write:eu", "billing:read", "reportsx:read", "keys:read"]
    for holder in (admin, namespace, developer):
        header = holder.headers["Authorization"]
        caller = await keysvc.verify(header)
        for permission in asked:
            try:
                await keysvc.verify(header, permission=permission)
                admitted = True
            except Forbidden:
                admitted = False
            assert caller.may(permission) is admitted, (sorted(caller.permissions), permission)


async def test_a_call_keysvc_may_have_acted_on_is_not_sent_again(
    keysvc: Either, client: TestClient, admin: Creds
) -> None:
    """A relay passes each request to keysvc and, when told, drops keysvc's answer: a
    GET of the management API is asked again and answered, but a credits change or a
    verify with a cost (each spent by keysvc) is sent once and raises Unavailable."""
    org = admin.organization_id
    metered = await create_creds(
        client, admin, {"name": "m", "roles": ["developer"], "credits": {"remaining": 10}}
    )
    assert client.server.port is not None
    async with Relay(client.server.port) as relay:
        through = Either(keysvc.kind, relay.base, admin.key_id, admin.secret)
        try:
            await through.whoami()  # a kept-alive connection, the one a retry follows
            relay.drops = 1
            assert (await through.get_key(org, metered.id)).value["credits"]["remaining"] == 10
            spends = (
                lambda: through.change_credits(org, metered.id, {"decrement": 1}),
                lambda: through.verify(metered.headers["Authorization"], cost=2),
            )
            for spend in spends:
                await through.whoami()
                relay.drops, sent = 1, len(relay.methods)
                with pytest.raises(Unavailable):
                    await spend()
                assert relay.methods[sent:] == ["POST"]
        finally:
            await through.aclose()
    assert (await keysvc.get_key(org, metered.id)).value["credits"]["remaining"] == 7
