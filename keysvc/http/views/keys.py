"""Key views: list, create, read, update, rotate and delete keys of an organization.

Keys are answered through ``keysvc.http.render`` (the hand-written twin of
``ApiKeySchema``). A list page is kept as UTF-8 for as long as nothing at all is
committed (``keysvc.db.cache.Caches.page``), so repeating it costs no query.
"""

from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from aiohttp import web

from keysvc.db.contract import Store
from keysvc.domain import identities, keycredits, keys
from keysvc.http import render
from keysvc.http.envelope import envelope, envelope_bytes, json_body_response, json_response
from keysvc.http.queries import KeyListQuerySchema
from keysvc.http.routes import (
    CHANGE_CREDITS,
    CREATE_KEY,
    DELETE_KEY,
    GET_KEY,
    LIST_KEYS,
    ROTATE_KEY,
    UPDATE_KEY,
    serves,
)
from keysvc.http.schemas import (
    CreateKeySchema,
    PatchKeySchema,
    RotateKeySchema,
    load,
)
from keysvc.http.state import CLOCK, HASHER, PREVIOUS_CREDENTIAL, REQUEST_ID, SETTINGS, STORE
from keysvc.http.views import resource
from keysvc.http.views.common import (
    actor,
    authorized,
    path_uuid,
    query,
    read_json_object,
    read_optional_json_object,
)
from keysvc.models import Key

_list_query = KeyListQuerySchema()
# Built once, not per request: building a marshmallow schema deep-copies its fields,
# which costs more than loading a body. Only the clock reading they check expireAt
# against changes; it is set right before each load, which is synchronous, so no
# other request runs in between.
_create_body = CreateKeySchema(now=datetime.fromtimestamp(0, UTC))
_patch_body = PatchKeySchema(now=datetime.fromtimestamp(0, UTC))
_rotate_body = RotateKeySchema()


def _load_at(
    schema: CreateKeySchema | PatchKeySchema, now: datetime, body: dict[str, Any]
) -> dict[str, Any]:
    schema.now = now
    return load(schema, body)


# The list's validated parameters by query string, as sent. Validating them is a pure
# function of that string, and costs a marshmallow load (about 8% of a list request
# under load); most calls ask for the same few pages, the first above all. A query
# that fails validation is never kept, and neither is one over _MEMO_QUERY_LENGTH.
_LIST_PARAMS: OrderedDict[str, Mapping[str, Any]] = OrderedDict()
LIST_PARAMS_KEPT = 256
_MEMO_QUERY_LENGTH = 512


def _list_params(request: web.Request) -> Mapping[str, Any]:
    # As sent: request.query_string is decoded, and two queries that parse apart
    # (cursor=%2541 and cursor=%41) may decode alike.
    raw = request.rel_url.raw_query_string
    params = _LIST_PARAMS.get(raw)
    if params is not None:
        _LIST_PARAMS.move_to_end(raw)
        return params
    params = MappingProxyType(load(_list_query, query(request)))  # read-only when shared
    if len(raw) <= _MEMO_QUERY_LENGTH:
        _LIST_PARAMS[raw] = params
        while len(_LIST_PARAMS) > LIST_PARAMS_KEPT:
            _LIST_PARAMS.popitem(last=False)
    return params


@serves(LIST_KEYS)
async def list_keys(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    params = _list_params(request)
    hasher = request.app[HASHER]
    after = keys.decode_cursor(hasher, organization_id, params.get("cursor"))
    store = request.app[STORE]
    limit, external_id = params["limit"], params.get("externalId")

    now = request.app[CLOCK]()

    async def page_text() -> tuple[bytes, bytes]:
        page = await keycredits.list_refreshed(
            store, organization_id, after, limit, external_id, now
        )
        cursor = keys.next_cursor(hasher, organization_id, page)
        rest = f', "nextCursor": {render.encode(cursor)}, "totalCount": {render.encode(page.total)}'
        found = page.identity_ids  # read with the page, in its one statement (issue 36)
        each = (_identified(render.key_json(key), found.get(key.id)) for key in page.keys)
        return f"[{', '.join(each)}]".encode(), rest.encode()

    # Refills fall due at 00:00 UTC only: a page is kept for its day at most.
    page = ("keys", organization_id, after, limit, external_id, now.date())
    rendered = await store.cached_page(page, page_text)
    return json_body_response(envelope_bytes(request[REQUEST_ID], *rendered))


@serves(CREATE_KEY)
async def create_key(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    now = request.app[CLOCK]()
    data = _load_at(_create_body, now, await read_json_object(request))
    issued = await keys.create_key(
        request.app[STORE],
        request.app[HASHER],
        caller,
        organization_id,
        data,
        now,
        request.app[SETTINGS].max_keys_per_org,
        actor(request),
    )
    return await _issued_response(request, issued)


async def _key_text(request: web.Request, key: Key) -> str:
    """The key's JSON, with the ``identityId`` of the identity it belongs to (issue 36)."""
    return _identified(
        render.key_json(key), await identities.identity_id_of(request.app[STORE], key)
    )


def _identified(text: str, identity_id: str | None) -> str:
    """A key's JSON ``text`` with ``identityId`` last, as in every answer that shows keys."""
    if identity_id is None:
        return text
    return f'{text[:-1]}, "identityId": {render.encode(identity_id)}}}'


async def _issued_response(request: web.Request, issued: keys.Issued) -> web.Response:
    """The key, and its credentials when keysvc generated them: with hashData the
    client chose its own, and none are echoed."""
    result = f'{{"key": {await _key_text(request, issued.key)}'
    if issued.key_id is not None:
        result += f', "keyId": {render.encode(issued.key_id)}'
        result += f', "keySecret": {render.encode(issued.secret)}'
    return json_response(envelope(request[REQUEST_ID], result + "}"))


@serves(GET_KEY)
async def get_key(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    store, key_id = request.app[STORE], path_uuid(request, "keyId")
    # A cached key is answered without a coroutine; only a miss awaits the read.
    key = keys.cached_key(store, organization_id, key_id) or await keys.read_key(
        store, organization_id, key_id
    )
    if key.credits is not None:  # a refill due is applied on read
        key = await keycredits.refreshed(store, key, request.app[CLOCK]())
    return await _key_response(request, key)


@serves(UPDATE_KEY)
async def update_key(request: web.Request) -> web.Response:
    key = await resource.update(request, "keyId", _checked_patch, keys.update_key)
    return await _key_response(request, key)


async def _checked_patch(
    store: Store, caller: Key, organization_id: str, key_id: str, body: dict[str, Any],
    now: datetime,
) -> dict[str, Any]:  # fmt: skip
    """The patch, validated once the caller is known to be allowed the fields it sends."""
    await keys.check_update(store, caller, organization_id, key_id, body)
    return _load_at(_patch_body, now, body)


@serves(ROTATE_KEY)
async def rotate_key(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    key_id = path_uuid(request, "keyId")
    data = load(_rotate_body, await read_optional_json_object(request))
    issued = await keys.rotate_key(
        request.app[STORE],
        request.app[HASHER],
        caller,
        request.get(PREVIOUS_CREDENTIAL, False),
        organization_id,
        key_id,
        data,
        actor(request),
        request.app[CLOCK](),
    )
    return await _issued_response(request, issued)


async def _key_response(request: web.Request, key: Key) -> web.Response:
    """The key in the envelope, with its ETag for a later If-Match."""
    response = json_response(envelope(request[REQUEST_ID], await _key_text(request, key)))
    return resource.tagged(response, key.etag)


@serves(CHANGE_CREDITS)
async def change_credits(request: web.Request) -> web.Response:
    key = await resource.change_credits(request, "keyId", keycredits.change_credits)
    return await _key_response(request, key)


@serves(DELETE_KEY)
async def delete_key(request: web.Request) -> web.Response:
    return await resource.delete(request, "keyId", keys.delete_key)
