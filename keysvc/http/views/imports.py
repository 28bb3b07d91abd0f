"""The import view (issue 37): up to a thousand records in one request, each checked
on its own (``keysvc.http.import_schemas.load_records``), stored in one transaction by
``keysvc.domain.imports.import_batch``; the answer lists what was made, skipped and
refused. Its body may be larger than any other route's (``MAX_IMPORT_BYTES``)."""

import asyncio
from typing import Any

from aiohttp import web

from keysvc.domain import imports
from keysvc.errors import ApiError, BadRequest, RequestTimeout, UnsupportedMediaType
from keysvc.http.envelope import ok
from keysvc.http.import_routes import IMPORT_KEYS
from keysvc.http.import_schemas import ImportKeysSchema, load_records
from keysvc.http.routes import serves
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, HASHER, IMPORT_TURNS, SETTINGS, STORE
from keysvc.http.views.common import BODY_REQUIRED, actor, authorized, decode_json

# A thousand records of up to about 8 KiB each (a long meta, a full IP list).
MAX_IMPORT_BYTES = 8 * 1024 * 1024
_body = ImportKeysSchema()


class ImportTooLarge(ApiError):
    """An import body over MAX_IMPORT_BYTES; the rest of it is never read."""

    status = 413
    closes = True
    default_message = f"request body too large: an import's limit is {MAX_IMPORT_BYTES} bytes"


async def _read(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, within the import's own size limit."""
    if not request.body_exists:
        raise BadRequest(BODY_REQUIRED)
    if request.content_type != "application/json":
        raise UnsupportedMediaType()
    if request.content_length is not None and request.content_length > MAX_IMPORT_BYTES:
        raise ImportTooLarge()
    timeout = request.app[SETTINGS].header_timeout
    try:
        async with asyncio.timeout(timeout):
            raw = await request.clone(client_max_size=MAX_IMPORT_BYTES).read()
    except TimeoutError:
        raise RequestTimeout(f"body: not received within {timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise ImportTooLarge() from None
    except web.RequestPayloadError:
        raise BadRequest("body: could not be read") from None
    value: dict[str, Any] = decode_json(raw, dict, "a JSON object")
    return value


@serves(IMPORT_KEYS)
async def import_keys(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    now = request.app[CLOCK]()
    records = load(_body, await _read(request))["keys"]
    valid, refused = load_records(enumerate(records), now)
    if not request.app[SETTINGS].api_token_import:
        valid, refused = _without_tokens(valid, refused)
    result = await imports.import_batch(
        request.app[STORE],
        request.app[HASHER],
        caller,
        organization_id,
        valid,
        now,
        request.app[SETTINGS].max_keys_per_org,
        actor(request),
        request.app[IMPORT_TURNS],
        request.app[CLOCK],
    )
    errors = sorted([*refused, *result.errors], key=lambda error: error[0])
    return ok(
        request,
        {
            "imported": len(result.imported),
            "skipped": len(result.skipped),
            "keys": [{"index": i, "importId": d, "id": k} for i, d, k in result.imported],
            "errors": [{"index": i, "importId": d, "error": e} for i, d, e in errors],
        },
    )


# A token hash is the bearer token's own digest, looked up in every organization: an
# import's answer ("taken" or not) would let any tenant that may create keys test a
# thousand guesses at other tenants' tokens a request, past the failed-login limit.
TOKENS_OFF = (
    "tokenHash: token hashes are imported with `keysvc import` on this server"
    " (KEYSVC_API_TOKEN_IMPORT is 0)"
)


def _without_tokens(
    valid: list[tuple[int, dict[str, Any]]], refused: list[tuple[int, str | None, str]]
) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str | None, str]]]:
    """The records that carry no token hash; the others refused, by their index."""
    kept = [(index, data) for index, data in valid if "tokenHash" not in data]
    refused = refused + [
        (index, data.get("importId"), TOKENS_OFF) for index, data in valid if "tokenHash" in data
    ]
    return kept, refused
