"""Small leaks: a 409 that repeats the role name sent, and debug log lines that
carry the keyed hash of a key ID someone tried (aiosqlite logs every statement
it runs, its parameters included)."""

import base64
import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from keysvc.config import pepper_path_of
from keysvc.credentials import Hasher, load_pepper, new_key_id, new_secret
from keysvc.roles import ROLE_NAME_TAKEN
from tests.helpers import Client, Creds, assert_error, basic, create_role
from tests.server import Server, bootstrap


async def test_role_name_conflict_does_not_repeat_the_name(client: Client, admin: Creds) -> None:
    name = f"ops-{uuid.uuid4().hex}"
    await create_role(client, admin, {"name": name})
    url = f"/v1/organizations/{admin.organization_id}/roles"
    response = await client.post(url, json={"name": name}, headers=admin.headers)
    await assert_error(response, 409, ROLE_NAME_TAKEN)
    assert name not in await response.text()
    assert uuid.UUID(name.removeprefix("ops-")).hex not in await response.text()


def _status(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def _forms(digest: bytes) -> list[str]:
    """How a hash could appear in a log line: hex, base64, or as Python shows bytes."""
    return [digest.hex(), base64.b64encode(digest).decode(), repr(digest)[2:-1]]


def test_debug_log_holds_no_keyed_hash_of_a_key_id(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    hasher = Hasher(load_pepper(None, pepper_path_of(db)))
    admin = basic(created["keyId"], created["keySecret"])
    unknown_id = new_key_id()
    tries = [
        (admin, 200),  # first use: its row is read by key-ID hash
        (basic(created["keyId"], new_secret()), 401),  # a wrong secret
        (basic(unknown_id, new_secret()), 401),  # no such key
    ]
    with Server(db, env={"KEYSVC_LOG_LEVEL": "debug"}) as server:
        for headers, status in tries:
            assert _status(server.base + "/v1/whoami", headers) == status
        server.stop()
        log = server.stderr_text()
    # What each line says, escapes undone: the text someone reading the log would see.
    said = "\n".join(str(value) for line in log.splitlines() for value in json.loads(line).values())
    assert '"level": "debug"' in log and "aiosqlite" in log  # the statements were logged
    for key_id in (created["keyId"], unknown_id):
        for form in _forms(hasher.of_plain(key_id)):
            assert form not in said
            assert form not in log
