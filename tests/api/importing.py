"""What the import tests share (issue 37): a record of the API's import, and an import
through the API that must succeed."""

import hashlib
import secrets
from typing import Any

from tests.helpers import Client, Creds, assert_ok, keys_url


def record(import_id: str, **fields: Any) -> dict[str, Any]:
    """An import record: a token hash (of ``token``, else a random one) and a
    developer's role, with ``fields`` over them (None: left out)."""
    token = fields.pop("token", None) or secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    material = {"tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest}}
    made = {"importId": import_id, "name": import_id, "roles": ["developer"], **material, **fields}
    return {name: value for name, value in made.items() if value is not None}


async def import_keys(client: Client, caller: Creds, records: list[Any]) -> dict[str, Any]:
    """POST .../keys/import of ``records`` as ``caller``: its result (a 200)."""
    response = await client.post(
        keys_url(caller) + "/import", json={"keys": records}, headers=caller.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result
