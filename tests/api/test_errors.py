"""The error envelope on every error path, success's envelope, and the 500."""

import logging
import os
import sys
import threading
import uuid

import pytest

from keysvc.config import Settings
from keysvc.http.middleware import REQUEST_IDS_PER_POOL, new_request_id
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    exploding_client,
)


def test_request_ids_are_random_uuid4_across_pools_and_threads() -> None:
    count = 3 * REQUEST_IDS_PER_POOL + 5
    ids: list[str] = []

    def make() -> None:
        ids.extend(new_request_id() for _ in range(count))

    threads = [threading.Thread(target=make) for _ in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often, pool swaps included
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(set(ids)) == 4 * count
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    # 122 random bits: every hex digit outside the version and variant takes all 16 values.
    digits = [set(column) for column in zip(*(t.replace("-", "") for t in ids), strict=True)]
    assert [len(column) for column in digits] == [16] * 12 + [1] + [16] * 3 + [4] + [16] * 15


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
# Python 3.12 warns of a fork while threads run; the child here only writes and exits.
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_worker_never_repeats_its_parents_request_ids() -> None:
    new_request_id()  # a pool, partly handed out, as a server's would be at fork time
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        try:
            os.write(write, " ".join(new_request_id() for _ in range(10)).encode())
        finally:
            os._exit(0)  # never back into pytest
    os.close(write)
    _, status = os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        childs = set(pipe.read().split())
    assert os.waitstatus_to_exitcode(status) == 0 and len(childs) == 10
    parents = {new_request_id() for _ in range(REQUEST_IDS_PER_POOL)}
    assert not childs & parents


async def test_success_envelope_has_fresh_request_ids(client: Client, admin: Creds) -> None:
    url = f"/v1/organizations/{admin.organization_id}/keys/{admin.id}"
    first = await client.get(url, headers=admin.headers)
    second = await client.get(url, headers=admin.headers)
    await assert_ok(first)
    await assert_ok(second)  # assert_ok refuses a requestId seen before


async def test_unknown_route_is_404_envelope(client: Client) -> None:
    await assert_error(await client.get("/v2/whatever"), 404, "not found: no such endpoint")


async def test_wrong_method_is_405_envelope_with_allow(client: Client, admin: Creds) -> None:
    response = await client.put(f"/v1/organizations/{admin.organization_id}/keys")
    await assert_error(response, 405, "method PUT is not allowed here; allowed: GET, HEAD, POST")
    assert sorted(response.headers["Allow"].split(",")) == ["GET", "HEAD", "POST"]


@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
async def test_a_literal_path_beside_a_key_id_answers_405_to_other_methods(
    client: Client, admin: Creds, method: str
) -> None:
    """``.../keys/import`` serves POST alone: another method is a 405, not a 400 that
    takes "import" for a bad key ID."""
    url = f"/v1/organizations/{admin.organization_id}/keys/import"
    response = await client.request(method, url, headers=admin.headers)
    await assert_error(response, 405, f"method {method} is not allowed here; allowed: POST")
    assert response.headers["Allow"] == "POST"


@pytest.mark.parametrize("name", ["organizationId", "keyId"])
@pytest.mark.parametrize(
    "bad", ["not-a-uuid", "0B5D3C8E-6C1A-4C59-9D8A-7A1F0E000001", "1' or '1'='1", "%00"]
)
async def test_non_uuid_path_parameter_is_400(
    client: Client, admin: Creds, name: str, bad: str
) -> None:
    org = bad if name == "organizationId" else admin.organization_id
    key = bad if name == "keyId" else admin.id
    response = await client.get(f"/v1/organizations/{org}/keys/{key}", headers=admin.headers)
    await assert_error(
        response,
        400,
        f"{name}: must be a lowercase UUID such as 123e4567-e89b-42d3-a456-426614174000",
    )


async def test_internal_error_is_logged_with_request_id_and_hidden(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await exploding_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    with caplog.at_level(logging.ERROR, logger="keysvc"):
        response = await client.get("/v1/explode", headers=admin.headers)
        body = await assert_error(response, 500, "internal server error")
    assert "internals" not in await response.text()
    logged = [r for r in caplog.records if body["requestId"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None
