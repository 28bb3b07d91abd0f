"""keysvc.http.dispatch: a verify answered straight by the middleware and view is the
answer the application's router and middleware chain give, request for request; and
``keysvc serve``'s runner (and the tests' server) takes that path."""

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from keysvc.config import Settings
from keysvc.http.app import create_app
from keysvc.http.connections import ServiceRunner
from keysvc.http.dispatch import Dispatch, DispatchRunner
from tests.helpers import Client, ClientFactory, FakeClock, basic, bootstrap, create_creds

# Headers that differ between any two answers: the fresh ID, and aiohttp's clock.
_FRESH = {"x-request-id", "date"}


def _answer(status: int, headers: Any, body: bytes) -> tuple[int, dict[str, str], Any]:
    kept = {name: value for name, value in headers.items() if name.lower() not in _FRESH}
    try:
        parsed = json.loads(body)
    except ValueError:
        return status, kept, body
    if isinstance(parsed, dict):
        parsed.pop("requestId", None)
    return status, kept, parsed


async def _ask(client: Client, method: str, path: str, **kwargs: Any) -> Any:
    async with client.request(method, path, allow_redirects=False, **kwargs) as response:
        return _answer(response.status, response.headers, await response.read())


async def test_a_direct_verify_answers_as_the_application_does(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    """Two apps on one database and one clock: one served by aiohttp's plain runner (the
    router, then the chain), one as keysvc serves (``DispatchRunner``). Every verify
    below, of every outcome, is answered the same by both, headers and envelope alike;
    and so are the paths that only look like /v1/verify."""
    direct_app, routed_app = create_app(settings, clock=clock), create_app(settings, clock=clock)
    direct = await aiohttp_client(direct_app)
    routed = await aiohttp_client(TestServer(routed_app))  # aiohttp's own AppRunner
    assert isinstance(direct.server.runner, DispatchRunner)
    assert not isinstance(routed.server.runner, DispatchRunner)
    admin = await bootstrap(direct_app)
    key = await create_creds(direct, admin, {"name": "svc", "roles": ["developer"]})
    good = key.headers
    wrong = basic(key.key_id, key.secret[:-1] + ("x" if key.secret[-1] != "x" else "y"))
    asks: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/v1/verify", {"headers": good}),
        ("HEAD", "/v1/verify", {"headers": good}),
        ("POST", "/v1/verify", {"headers": good, "data": b"ignored"}),
        ("DELETE", "/v1/verify", {"headers": good}),
        ("GET", "/v1/verify", {}),
        ("GET", "/v1/verify", {"headers": wrong}),
        ("GET", "/v1/verify", {"headers": {**good, "Accept": "application/json"}}),
        ("GET", "/v1/verify", {"headers": {**good, "X-Required-Permission": "keys:write"}}),
        ("GET", "/v1/verify?permission=keys:read", {"headers": good}),
        ("GET", "/v1/verify?permission=((", {"headers": good}),
        ("GET", "/v1/verify", {"headers": {**good, "X-Credit-Cost": "x"}}),
        ("POST", "/v1/verify", {"headers": {**good, "Expect": "100-continue"}, "data": b"{}"}),
        ("GET", "/v1/%76erify", {"headers": good}),
        ("GET", "/v1/verify/", {"headers": good}),
        ("GET", "/V1/verify", {"headers": good}),
        ("GET", "/v1//verify", {"headers": good}),
        ("GET", "/v1/verify%2F", {"headers": good}),
    ]
    for method, path, kwargs in asks:
        # The same failed logins on both, in the same order: their throttles agree.
        first = await _ask(direct, method, path, **kwargs)
        second = await _ask(routed, method, path, **kwargs)
        assert first == second, (method, path)
    assert (await _ask(direct, "GET", "/v1/verify", headers=good))[0] == 200


async def test_keysvc_serve_and_the_tests_answer_verifies_directly(
    client: Client, settings: Settings, clock: FakeClock
) -> None:
    """keysvc's app takes the direct path; ``keysvc serve``'s runner is a DispatchRunner,
    and the tests' server hands its requests to a Dispatch that takes it."""
    assert Dispatch(create_app(settings, clock=clock)).direct
    assert issubclass(ServiceRunner, DispatchRunner)
    runner = client.server.runner
    assert runner is not None and runner.server is not None
    handler = runner.server.request_handler
    owner = getattr(handler, "__self__", None)
    assert isinstance(owner, Dispatch) and owner.direct and owner.app is client.app


async def test_an_app_the_router_cannot_be_skipped_for_goes_through_it(
    settings: Settings, clock: FakeClock
) -> None:
    """Not keysvc's one middleware, or a second resource at /v1/verify: no direct path,
    and every request goes through the application."""
    extra = create_app(settings, clock=clock)
    extra.middlewares.append(web.normalize_path_middleware())
    assert not Dispatch(extra).direct
    shadowed = create_app(settings, clock=clock)
    shadowed.router.add_get("/v1/verify", _nothing)
    assert not Dispatch(shadowed).direct


async def _nothing(request: web.Request) -> web.Response:
    return web.Response(status=204)
