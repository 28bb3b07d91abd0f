"""KEYSVC_SECRET_PREFIX: a deployment issues secrets with its own prefix, so that
scanners tell its secrets from another deployment's; secrets issued under the prefix
before still work and can still be reported leaked; a secret of the new prefix with a
wrong checksum is refused as malformed; the logs scrub secrets of either prefix."""

import re

import pytest

from keysvc.config import ConfigError, Settings, build_settings
from keysvc.credentials import CHECKSUM_LENGTH, SECRET_PATTERN, checksum, secret_pattern
from keysvc.http.state import LEAK_REPORTS
from keysvc.logs import REDACTED, scrub, scrub_secrets_of
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create_creds,
)


async def test_a_new_prefix_keeps_the_old_secrets_working(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    before = await client_with(aiohttp_client, settings, clock)
    admin = await bootstrap(before.app)
    old = await create_creds(before, admin, {"name": "old", "roles": ["developer"]})
    reported = await create_creds(before, admin, {"name": "reported", "roles": ["developer"]})
    assert re.fullmatch(SECRET_PATTERN, old.secret)
    await before.close()

    client = await client_with(aiohttp_client, settings, clock, secret_prefix="acme_live_")
    new = await create_creds(client, admin, {"name": "new", "roles": ["developer"]})
    assert re.fullmatch(secret_pattern("acme_live_"), new.secret)
    body = new.secret.removeprefix("acme_live_")
    assert checksum(body[:-CHECKSUM_LENGTH]) == body[-CHECKSUM_LENGTH:]
    for creds in (admin, old, new):
        await assert_ok(await client.get("/v1/whoami", headers=creds.headers))

    # A look-alike of the new prefix with a wrong checksum: refused before any lookup.
    wrong = new.secret[:-1] + ("A" if new.secret[-1] != "A" else "B")
    refused = await client.get("/v1/whoami", headers=basic(new.key_id, wrong))
    assert refused.status == 401

    # Secrets of either prefix are found by their hash alone.
    for leaked in (reported, new):
        answer = await client.post("/v1/keys/revoke-leaked", json={"secret": leaked.secret})
        assert (await assert_ok(answer)) == {"status": "received"}
        await client.app[LEAK_REPORTS].work_through()  # acted on after the answer
        response = await client.get("/v1/whoami", headers=leaked.headers)
        assert response.status == 401
    await assert_ok(await client.get("/v1/whoami", headers=old.headers))
    await _still_listed(client, admin, {"old", "reported", "new"})


async def _still_listed(client: Client, admin: Creds, names: set[str]) -> None:
    url = f"/v1/organizations/{admin.organization_id}/keys"
    keys = await assert_ok(await client.get(url, headers=admin.headers))
    assert names <= {key["name"] for key in keys}


@pytest.mark.parametrize(
    "value", ["Acme_", "acme", "_acme_", "a_", "whsec_", "acme-live_", "x" * 40 + "_", "ac me_"]
)
def test_a_bad_prefix_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build_settings(env={"KEYSVC_SECRET_PREFIX": value})
    message = str(refused.value)
    assert message.startswith("secret-prefix: ") and "\n" not in message


def test_good_prefixes_are_taken() -> None:
    assert build_settings(env={}).secret_prefix == "keysvc_"
    for value in ("acme_", "acme_live_", "k9_"):
        assert build_settings(env={"KEYSVC_SECRET_PREFIX": value}).secret_prefix == value


def test_the_logs_scrub_secrets_of_a_deployments_prefix() -> None:
    body = "Q" * 36
    secret = "acme_test_" + body + checksum(body)
    scrub_secrets_of("acme_test_")
    assert scrub(f"a line with {secret} in it") == f"a line with {REDACTED} in it"
    default = "keysvc_" + body + checksum(body)
    assert scrub(f"and {default}") == f"and {REDACTED}"
