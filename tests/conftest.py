import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from keysvc import keys
from keysvc.app import create_app
from keysvc.config import Settings
from keysvc.state import CLOCK, HASHER, STORE
from tests.helpers import Creds, FakeClock, assert_ok

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]
Client = TestClient[web.Request, web.Application]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(db_path=tmp_path / "keysvc.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(settings: Settings, clock: FakeClock) -> web.Application:
    return create_app(settings, clock=clock)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, app: web.Application) -> Client:
    return await aiohttp_client(app)


async def client_with(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, **changes: Any
) -> Client:
    """A client of its own app, whose settings are the fixture's with ``changes``."""
    return await aiohttp_client(create_app(dataclasses.replace(settings, **changes), clock=clock))


async def bootstrap(app: web.Application, name: str = "acme") -> Creds:
    """A new organization and its admin key, made the way `keysvc bootstrap` makes them."""
    org, issued = await keys.bootstrap(app[STORE], app[HASHER], name, app[CLOCK]())
    assert issued.key_id and issued.secret
    return Creds(org.id, issued.key.id, issued.key_id, issued.secret)


@pytest.fixture
async def admin(client: Client) -> Creds:
    return await bootstrap(client.app)


@pytest.fixture
async def other_admin(client: Client) -> Creds:
    """The admin of a second organization."""
    return await bootstrap(client.app, "other")


async def create_role(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    """Create a custom role through the API and return it."""
    response = await client.post(
        f"/v1/organizations/{caller.organization_id}/roles", json=body, headers=caller.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result


async def create(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    """Create a key through the API and return the whole create result."""
    response = await client.post(
        f"/v1/organizations/{caller.organization_id}/keys", json=body, headers=caller.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result


async def create_creds(client: Client, caller: Creds, body: dict[str, Any]) -> Creds:
    result = await create(client, caller, body)
    return Creds(caller.organization_id, result["key"]["id"], result["keyId"], result["keySecret"])
