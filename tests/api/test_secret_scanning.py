"""GitHub secret scanning (``POST /v1/secret-scanning/github``) through the real app on
both backends, with a P-256 key pair the test makes and a keys file in GitHub's format:
a signed report disables the matching key and refuses its credentials at once, records
the report's url and source and sends ``key.leaked``; the feedback labels true and false
positives without echoing a token; bad signatures, unknown identifiers and malformed
bodies change nothing; the same report again is idempotent; off, the route is a 404."""

import asyncio
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from keysvc.config import ConfigError, Settings, build_settings
from keysvc.credentials import checksum
from keysvc.scanning import SIGNATURE_HEADER, load_keys
from tests.api.activities import listed
from tests.api.scanning import SCANNING, GitHubSigner, report
from tests.api.webhooks import create_webhook, private_client
from tests.handsql import audit_verdict
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create_creds,
    get_key,
)
from tests.receiver import Receiver

ENCODED_REFUSAL = (
    "a secret scanning report is verified over its body as sent: send it without Content-Encoding"
)

# A look-alike: the format and a valid checksum, but no key's secret.
LOOK_ALIKE_BODY = "Z" * 36
LOOK_ALIKE = "keysvc_" + LOOK_ALIKE_BODY + checksum(LOOK_ALIKE_BODY)


async def _scanning_client(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path,
    signer: GitHubSigner, **changes: Any,
) -> Client:  # fmt: skip
    keys = load_keys(signer.write(tmp_path / "github-keys.json"))
    return await private_client(
        aiohttp_client, settings, clock, github_scanning_keys=keys, **changes
    )


async def _settled_log(client: Client, admin: Creds, awaited: str) -> list[dict[str, Any]]:
    """The activity log once a record of type ``awaited`` is in it."""
    for _ in range(300):
        records = await listed(client, admin)
        if any(a["type"] == awaited for a in records):
            return records
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {awaited} record")


async def _state(client: Client, admin: Creds, key_id: str) -> str:
    state: str = (await get_key(client, admin, key_id))["state"]
    return state


async def _post(client: Client, body: bytes, headers: dict[str, str]) -> Any:
    return await client.post(SCANNING, data=body, headers=headers)


async def test_a_signed_report_disables_the_key_and_labels_each_token(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path,
    receiver: Receiver,
) -> None:  # fmt: skip
    signer = GitHubSigner()
    client = await _scanning_client(aiohttp_client, settings, clock, tmp_path, signer)
    admin = await bootstrap(client.app)
    await create_webhook(client, admin, {"url": receiver.url, "events": ["key.leaked"]})
    leaked = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await assert_ok(await client.get("/v1/whoami", headers=leaked.headers))  # cached

    body = report(leaked.secret, LOOK_ALIKE)
    response = await _post(client, body, signer.headers(body))
    assert response.status == 200, await response.text()
    text = await response.text()
    assert leaked.secret not in text and LOOK_ALIKE not in text
    assert response.headers["X-Request-Id"]
    assert json.loads(text) == [
        {
            "token_hash": hashlib.sha256(leaked.secret.encode()).hexdigest(),
            "token_type": "keysvc_secret",
            "label": "true_positive",
        },
        {
            "token_hash": hashlib.sha256(LOOK_ALIKE.encode()).hexdigest(),
            "token_type": "keysvc_secret",
            "label": "false_positive",
        },
    ]
    await assert_error(
        await client.get("/v1/whoami", headers=leaked.headers), 401, "key is disabled"
    )
    assert await _state(client, admin, leaked.id) == "disabled"
    leak = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert len(leak) == 1
    assert leak[0]["targetKeyId"] == leaked.id
    assert leak[0]["after"] == {
        "reporter": "github", "action": "disabled", "credential": "current",
        "url": "https://github.com/o/r/blob/abc/config.py", "source": "content",
        "tokenType": "keysvc_secret",
    }  # fmt: skip
    received = await receiver.wait_for(lambda got: len(got) >= 1)
    assert [r.event["type"] for r in received] == ["key.leaked"]
    assert received[0].event["data"]["id"] == leaked.id

    # The same report again: the same labels, nothing more recorded or sent. (The
    # refused whoami above is recorded in the background: waited for first.)
    before = await _settled_log(client, admin, "key_used_after_revoke")
    again = await _post(client, body, signer.headers(body))
    assert [e["label"] for e in await again.json()] == ["true_positive", "false_positive"]
    assert await listed(client, admin) == before
    await asyncio.sleep(1.5)  # a delivery would be attempted within the retry second
    assert [r.event["type"] for r in receiver.received] == ["key.leaked"]
    assert audit_verdict(settings).problem is None


async def test_unverified_or_malformed_reports_change_nothing(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path,
    caplog: pytest.LogCaptureFixture, receiver: Receiver,
) -> None:  # fmt: skip
    signer, stranger = GitHubSigner(), GitHubSigner("someone-else")
    client = await _scanning_client(aiohttp_client, settings, clock, tmp_path, signer)
    admin = await bootstrap(client.app)
    await create_webhook(
        client, admin, {"url": receiver.url, "events": ["key.leaked", "key.updated"]}
    )
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    body = report(made.secret)
    before = await listed(client, admin)

    bad_signature = {
        **signer.headers(body),
        SIGNATURE_HEADER: stranger.headers(body)[SIGNATURE_HEADER],
    }
    tampered = report(made.secret, url="https://example.com/other")
    no_identifier = {k: v for k, v in signer.headers(body).items() if "Identifier" not in k}
    for sent, headers, why in (
        (body, bad_signature, "Github-Public-Key-Signature does not verify"),
        (body, stranger.headers(body), "Github-Public-Key-Identifier names no key"),
        (body, no_identifier, "Github-Public-Key-Identifier is missing"),
        (tampered, signer.headers(body), "Github-Public-Key-Signature does not verify"),
        (body, {**signer.headers(body), SIGNATURE_HEADER: "not base64!"}, "does not verify"),
    ):
        caplog.clear()
        response = await _post(client, sent, headers)
        refused = await response.json()
        assert response.status == 403, refused
        assert set(refused) == {"status", "error", "requestId"}
        assert why in refused["error"]
        lines = [r.getMessage() for r in caplog.records if "secret scanning" in r.getMessage()]
        assert len(lines) == 1 and why.split(" names")[0] in lines[0]
        assert made.secret not in caplog.text

    for malformed in (
        b'{"token": "x"}',
        b"[]",
        json.dumps([{"token": made.secret, "type": "t"}]).encode(),
        json.dumps([{"token": made.secret, "type": "t", "url": "", "source": 5}]).encode(),
        json.dumps([{"token": "x", "type": "t", "url": "", "source": ""}] * 101).encode(),
        b"not json",
    ):
        caplog.clear()
        response = await _post(client, malformed, signer.headers(malformed))
        answer = await response.json()
        assert response.status == 400, answer
        assert set(answer) == {"status", "error", "requestId"}
        assert made.secret not in json.dumps(answer)
        assert made.secret not in caplog.text

    assert await listed(client, admin) == before
    assert await _state(client, admin, made.id) == "enabled"
    await assert_ok(await client.get("/v1/whoami", headers=made.headers))
    await asyncio.sleep(1.5)  # a delivery would be attempted within the retry second
    assert receiver.received == []


async def test_notify_leaves_the_key_enabled(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    signer = GitHubSigner()
    client = await _scanning_client(
        aiohttp_client, settings, clock, tmp_path, signer, leaked_key_action="notify"
    )
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    body = report(made.secret)
    answer = await (await _post(client, body, signer.headers(body))).json()
    assert answer[0]["label"] == "true_positive"
    assert await _state(client, admin, made.id) == "enabled"
    leak = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert [a["after"]["action"] for a in leak] == ["notified"]


async def test_off_by_default_the_route_is_an_unknown_path(client: Client) -> None:
    signer = GitHubSigner()
    body = report(LOOK_ALIKE)
    response = await _post(client, body, signer.headers(body))
    await assert_error(response, 404, "not found: no such endpoint")


def test_a_malformed_keys_file_is_refused_in_one_line(tmp_path: Path) -> None:
    good = GitHubSigner().write(tmp_path / "good.json")
    assert build_settings(env={"KEYSVC_GITHUB_SCANNING_KEYS": str(good)}).github_scanning_keys
    p384 = (
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    for text, said in (
        ("not json", "is not JSON"),
        ("{}", "needs"),
        ('{"public_keys": []}', "needs"),
        ('{"public_keys": [{"key_identifier": "a", "key": "nope"}]}', "is not a PEM public key"),
        (json.dumps({"public_keys": [{"key_identifier": "a", "key": p384}]}), "P-256"),
        ('{"public_keys": [{"key": "x"}]}', "key_identifier"),
    ):
        path = tmp_path / "keys.json"
        path.write_text(text)
        with pytest.raises(ConfigError) as refused:
            build_settings(env={"KEYSVC_GITHUB_SCANNING_KEYS": str(path)})
        message = str(refused.value)
        assert message.startswith("KEYSVC_GITHUB_SCANNING_KEYS: ") or message.startswith(
            "github-scanning-keys: "
        ), message
        assert said in message and "\n" not in message
    with pytest.raises(ConfigError, match="cannot read"):
        build_settings(env={"KEYSVC_GITHUB_SCANNING_KEYS": str(tmp_path / "missing.json")})


async def test_forged_reports_are_throttled_like_failed_logins(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    signer, stranger = GitHubSigner(), GitHubSigner()
    client = await _scanning_client(
        aiohttp_client, settings, clock, tmp_path, signer, auth_failures=2
    )
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    body = report(made.secret)
    for _ in range(2):
        assert (await _post(client, body, stranger.headers(body))).status == 403
    refused = await _post(client, body, signer.headers(body))
    assert refused.status == 429 and "Retry-After" in refused.headers
    clock.advance(seconds=61)
    assert await _state(client, admin, made.id) == "enabled"
    # GitHub's own reports count nothing: many in a row are all answered.
    for _ in range(3):
        answer = await _post(client, body, signer.headers(body))
        assert [e["label"] for e in await answer.json()] == ["true_positive"]
    assert await _state(client, admin, made.id) == "disabled"


async def test_a_report_is_verified_over_its_body_as_sent_never_a_decoded_one(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    signer = GitHubSigner()
    client = await _scanning_client(aiohttp_client, settings, clock, tmp_path, signer)
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    body = report(made.secret)
    packed = gzip.compress(body)
    for signed in (body, packed):  # over the JSON, or over the bytes sent
        headers = {**signer.headers(signed), "Content-Encoding": "gzip"}
        await assert_error(await _post(client, packed, headers), 415, ENCODED_REFUSAL)
    assert await _state(client, admin, made.id) == "enabled"
    answer = await _post(client, body, {**signer.headers(body), "Content-Encoding": "identity"})
    assert [e["label"] for e in await answer.json()] == ["true_positive"]
    assert await _state(client, admin, made.id) == "disabled"
