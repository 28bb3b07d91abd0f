"""keysvc.client's aiohttp middleware in front of a hello-world aiohttp service, checking
each request with a real `keysvc serve` (KEYSVC_VERIFY_REUSE_SECONDS at its default, 1 s):
the handler gets the caller; keysvc's refusals reach the client as keysvc gave them, and
keysvc unreachable is a 503 with Retry-After; answers are reused within keysvc's bound
(fewer verify requests reach keysvc than the service serves), a key disabled through the
API is refused within it, and a key with credits is verified and spent on every request;
the client's address reaches keysvc only when the service is told keysvc trusts it, and
never the address a client claims; the examples of docs/forward-auth/code.md run as written."""

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from keysvc.client import Verifier
from tests.helpers import ClientFactory, Creds
from tests.middleware import Keysvc, aiohttp_service, running_keysvc
from tests.server import Server, admin_creds, bootstrap, free_port

REUSE_SECONDS = 1  # keysvc's default
BOUND = REUSE_SECONDS + 0.5
UNAUTHORIZED = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"


@pytest.fixture(scope="module")
def keysvc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keysvc]:
    yield from running_keysvc(tmp_path_factory.mktemp("keysvc"))


@pytest.fixture
async def verifier(keysvc: Keysvc) -> AsyncIterator[Verifier]:
    made = Verifier(keysvc.base, organization=keysvc.admin.organization_id)
    yield made
    await made.close()


async def get(client: Any, path: str, creds: Creds | None = None) -> tuple[int, Any, Any]:
    response = await client.get(path, headers=creds.headers if creds else {})
    body = await response.json() if response.content_type == "application/json" else None
    return response.status, response.headers, body


def assert_envelope(body: Any, status: int, message: str) -> None:
    assert set(body) == {"status", "error", "requestId"}
    assert (body["status"], body["error"]) == (status, message)
    assert uuid.UUID(body["requestId"]).version == 4


async def test_the_handler_gets_the_caller_and_refusals_pass_as_keysvc_gave_them(
    keysvc: Keysvc, verifier: Verifier, aiohttp_client: ClientFactory
) -> None:
    client = await aiohttp_client(aiohttp_service(verifier))
    caller = keysvc.create_key(roles=["developer"], externalId="user-7", meta={"plan": "pro"})
    status, _, body = await get(client, "/", caller)
    assert status == 200
    assert body == {
        "keyId": caller.id,
        "organizationId": caller.organization_id,
        "permissions": ["keys:read", "roles:read"],
        "externalId": "user-7",
        "meta": None,  # verify's headers carry no meta: Verifier(full=True) asks for it
        "identity": None,
        "creditsRemaining": None,
    }
    status, headers, body = await get(client, "/reports", caller)
    assert status == 403 and headers["Cache-Control"] == "no-store"
    assert_envelope(body, 403, "this key lacks the permission reports:read")
    status, _, body = await get(client, "/")
    assert_envelope(body, 401, UNAUTHORIZED)
    assert (await client.get("/healthz")).status == 200


async def test_the_full_answer_brings_the_name_and_meta(
    keysvc: Keysvc, aiohttp_client: ClientFactory
) -> None:
    full = Verifier(keysvc.base, full=True)
    try:
        client = await aiohttp_client(aiohttp_service(full))
        caller = keysvc.create_key(roles=["admin"], meta={"plan": "pro"})
        status, _, body = await get(client, "/reports", caller)
        assert status == 200 and body["meta"] == {"plan": "pro"}
        assert len(full.kept) == 0  # keysvc never lets a JSON answer be reused
    finally:
        await full.close()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{free}",  # nothing listens
        "http://[::1",  # URLs aiohttp refuses on each request
        "http://127.0.0.1:99999",
    ],
)
async def test_keysvc_unreachable_is_a_503_with_retry_after(
    keysvc: Keysvc, aiohttp_client: ClientFactory, url: str
) -> None:
    nowhere = Verifier(url.format(free=free_port()), retry_after=3)
    try:
        client = await aiohttp_client(aiohttp_service(nowhere))
        status, headers, body = await get(client, "/", keysvc.admin)
        assert (status, headers["Retry-After"]) == (503, "3")
        assert_envelope(body, 503, "keysvc unavailable: try again later")
    finally:
        await nowhere.close()


async def test_answers_are_reused_within_the_bound_and_a_disabled_key_is_refused_within_it(
    keysvc: Keysvc, verifier: Verifier, aiohttp_client: ClientFactory
) -> None:
    client = await aiohttp_client(aiohttp_service(verifier))
    caller = keysvc.create_key(roles=["developer"])
    before = keysvc.verified()
    for _ in range(50):
        assert (await get(client, "/", caller))[0] == 200
    reached = keysvc.verified() - before
    assert 1 <= reached <= 3, reached  # one per bound, at most 1 s apart
    keysvc.api("PATCH", f"/keys/{caller.id}", {"state": "disabled"})
    disabled = time.monotonic()
    while (await get(client, "/", caller))[0] == 200:
        assert time.monotonic() - disabled <= BOUND, "still served past keysvc's bound"
        await asyncio.sleep(0.02)
    refused_after = time.monotonic() - disabled
    status, _, body = await get(client, "/", caller)
    assert status == 401 and body["error"] == "key is disabled", body
    print(f"disabled key refused {refused_after:.3f} s after the PATCH (bound {REUSE_SECONDS} s)")


async def test_a_key_with_credits_is_verified_and_spent_on_every_request(
    keysvc: Keysvc, verifier: Verifier, aiohttp_client: ClientFactory
) -> None:
    client = await aiohttp_client(aiohttp_service(verifier))
    caller = keysvc.create_key(roles=["developer"], credits={"remaining": 3})
    before = keysvc.verified()
    remaining = [(await get(client, "/", caller))[2]["creditsRemaining"] for _ in range(3)]
    assert remaining == [2, 1, 0]
    status, _, body = await get(client, "/", caller)
    assert status == 429 and body["error"].startswith("credits exhausted")
    assert keysvc.verified() - before == 4
    assert keysvc.api("GET", f"/keys/{caller.id}")["credits"]["remaining"] == 0
    assert len(verifier.kept) == 0


@pytest.fixture(scope="module")
def trusting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keysvc]:
    """A keysvc that trusts the services on 127.0.0.1 to name their client's address."""
    env = {"KEYSVC_TRUSTED_PROXIES": "127.0.0.1/32"}
    yield from running_keysvc(tmp_path_factory.mktemp("trusting"), env)


@pytest.mark.parametrize("forward", [True, False])
async def test_the_client_address_is_forwarded_only_when_keysvc_trusts_the_service(
    trusting: Keysvc, aiohttp_client: ClientFactory, forward: bool
) -> None:
    verifier = Verifier(trusting.base, forward_client_address=forward)
    try:
        service = await aiohttp_client(aiohttp_service(verifier))
        only_2 = trusting.create_key(roles=["developer"], ipAccessList=[{"source": "127.0.0.2"}])
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=connector) as from_2:
            response = await from_2.get(service.make_url("/"), headers=only_2.headers)
            assert response.status == (200 if forward else 403)
            response.release()
        claimed = {**only_2.headers, "X-Forwarded-For": "127.0.0.2"}
        assert (await service.get("/", headers=claimed)).status == 403  # from 127.0.0.1
    finally:
        await verifier.close()


def readme_examples() -> list[str]:
    """The Python blocks of docs/forward-auth/code.md (the README's "Verify from your own
    code" section, moved to the docs site)."""
    page = Path(__file__).resolve().parents[2] / "docs" / "forward-auth" / "code.md"
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


async def test_the_readme_service_runs_as_written(
    keysvc: Keysvc, aiohttp_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASE", keysvc.base)
    monkeypatch.setenv("ORG", keysvc.admin.organization_id)
    service, _ = readme_examples()
    names: dict[str, Any] = {"__name__": "readme_service"}
    exec(compile(service, "docs/forward-auth/code.md", "exec"), names)
    client = await aiohttp_client(names["app"])
    status, _, body = await get(client, "/", keysvc.admin)
    assert (status, body) == (200, {"keyId": keysvc.admin.id})
    developer = keysvc.create_key(roles=["developer"])
    assert (await get(client, "/", developer))[0] == 403


def test_the_readme_client_runs_as_written(keysvc: Keysvc) -> None:
    _, script = readme_examples()
    env = {
        **os.environ,
        "BASE": keysvc.base,
        "ORG": keysvc.admin.organization_id,
        "KEY_ID": keysvc.admin.key_id,
        "KEY_SECRET": keysvc.admin.secret,
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    names, gone = done.stdout.splitlines()
    assert "reports v2" in names and gone.startswith("404 ")


async def test_concurrent_requests_of_one_key_ask_keysvc_once_unless_each_must_be_seen(
    keysvc: Keysvc, verifier: Verifier, aiohttp_client: ClientFactory
) -> None:
    client = await aiohttp_client(aiohttp_service(verifier))
    plain = keysvc.create_key(roles=["developer"])
    metered = keysvc.create_key(roles=["developer"], credits={"remaining": 10})
    before = keysvc.verified()
    answers = await asyncio.gather(*(get(client, "/", plain) for _ in range(10)))
    assert [status for status, _, _ in answers] == [200] * 10
    assert keysvc.verified() - before == 1
    answers = await asyncio.gather(*(get(client, "/", metered) for _ in range(4)))
    assert sorted(body["creditsRemaining"] for _, _, body in answers) == [6, 7, 8, 9]
    assert keysvc.verified() - before == 5


async def test_a_kept_answer_is_found_without_a_coroutine_and_only_as_keysvc_allows_it(
    keysvc: Keysvc, verifier: Verifier, aiohttp_client: ClientFactory
) -> None:
    """``Verifier.reused``, the hit path the middlewares run before they await anything:
    the answer ``check`` kept, for the same question only, never a key with credits,
    and nothing once keysvc's bound has passed."""
    client = await aiohttp_client(aiohttp_service(verifier))
    caller = keysvc.create_key(roles=["developer"])
    credited = keysvc.create_key(roles=["developer"], credits={"remaining": 5})
    header = [caller.headers["Authorization"]]
    assert verifier.reused(header, None, None) is None  # not asked yet
    assert (await get(client, "/", caller))[0] == 200
    before = keysvc.verified()
    kept = verifier.reused(header, None, None)
    assert kept is not None and kept.key_id == caller.id
    assert (await get(client, "/", caller))[2]["keyId"] == caller.id
    assert keysvc.verified() == before  # served from what was kept
    assert verifier.reused(header, "reports:read", None) is None  # another question
    assert verifier.reused(header * 2, None, None) is None  # two headers: check refuses
    assert (await get(client, "/", credited))[0] == 200
    assert verifier.reused([credited.headers["Authorization"]], None, None) is None
    await asyncio.sleep(REUSE_SECONDS + 0.1)
    assert verifier.reused(header, None, None) is None  # past keysvc's bound


async def test_a_verifier_reaches_keysvc_on_its_unix_socket_through_the_session_given(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    """keysvc on a unix socket alone (``--tcp off``): the Verifier is given a session
    with aiohttp's UnixConnector, as docs/forward-auth/code.md says."""
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    socket = tmp_path / "keysvc.sock"
    with Server(db, unix=socket, tcp=False):
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket)))
        verifier = Verifier("http://keysvc", session=session)
        try:
            service = await aiohttp_client(aiohttp_service(verifier))
            status, _, body = await get(service, "/reports", admin)
            assert (status, body["keyId"]) == (200, admin.id)
            wrong = Creds(admin.organization_id, admin.id, admin.key_id, "0" * len(admin.secret))
            status, _, body = await get(service, "/", wrong)
            assert status == 401 and body["error"].startswith("invalid credentials"), body
        finally:
            await verifier.close()
            await session.close()
