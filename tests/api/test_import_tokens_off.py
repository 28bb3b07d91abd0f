"""Token hashes through POST .../keys/import, off by default (KEYSVC_API_TOKEN_IMPORT):
a token hash is looked up in every organization, so an import's "taken" would let any
tenant that may create keys test a thousand guesses at other tenants' bearer tokens a
request, past the failed-login limit (rt/37's F4). Off, every token record is refused
alike, taken or not, and the batch's other records go in; `keysvc import` (the
operator's) still takes them."""

import asyncio
import hashlib
import io
import json
import secrets
from typing import Any

from keysvc.cli import porting
from keysvc.config import Settings
from keysvc.http.views.imports import TOKENS_OFF
from tests.helpers import Client, Creds, assert_ok, bootstrap, keys_url


def _token_record(import_id: str, token: str) -> dict[str, Any]:
    digest = hashlib.sha256(token.encode()).hexdigest()
    return {
        "importId": import_id,
        "name": "imported",
        "roles": ["developer"],
        "tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest},
    }


async def _import(client: Client, admin: Creds, records: list[Any]) -> dict[str, Any]:
    response = await client.post(
        keys_url(admin) + "/import", json={"keys": records}, headers=admin.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result


async def test_a_token_record_is_refused_alike_whether_another_organization_holds_it(
    client: Client, admin: Creds, settings: Settings
) -> None:
    held = "sk_live_" + secrets.token_urlsafe(32)
    # Another tenant, for which the operator imported `held` with `keysvc import`.
    other = await bootstrap(client.app, "other")
    lines = io.BytesIO(json.dumps(_token_record("theirs", held)).encode() + b"\n")
    summary, code = await asyncio.to_thread(
        porting.import_file, settings, other.organization_id, lines, 100, io.StringIO()
    )
    assert (code, summary["imported"]) == (0, 1)
    fresh = "sk_live_" + secrets.token_urlsafe(32)
    result = await _import(
        client,
        admin,
        [
            _token_record("guess-held", held),
            {"importId": "plain", "name": "plain", "roles": ["developer"]},
            _token_record("guess-fresh", fresh),
        ],
    )
    assert result["imported"] == 1 and [k["index"] for k in result["keys"]] == [1]
    assert result["errors"] == [
        {"index": 0, "importId": "guess-held", "error": TOKENS_OFF},
        {"index": 2, "importId": "guess-fresh", "error": TOKENS_OFF},
    ]
    listed = await client.get(keys_url(admin), headers=admin.headers)
    names = [key["name"] for key in await assert_ok(listed)]
    assert names.count("imported") == 0 and names.count("plain") == 1
