"""What a real `keysvc serve` at debug level logs: no keyed hash of a key ID, in any of
its forms."""

import base64
import json
from pathlib import Path

from keysvc.config import pepper_path_of
from keysvc.credentials import Hasher, load_pepper, new_key_id, new_secret
from tests.helpers import basic
from tests.server import Server, bootstrap, status_of


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
            assert status_of(server.base + "/v1/whoami", headers) == status
        server.stop()
        log = server.stderr_text()
    # What each line says, escapes undone: the text someone reading the log would see.
    said = "\n".join(str(value) for line in log.splitlines() for value in json.loads(line).values())
    assert '"level": "debug"' in log and "aiosqlite" in log  # the statements were logged
    for key_id in (created["keyId"], unknown_id):
        for form in _forms(hasher.of_plain(key_id)):
            assert form not in said
            assert form not in log
