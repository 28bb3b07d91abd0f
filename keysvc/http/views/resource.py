"""One implementation of the writes that keys and identities (issue 36, made on the
keys' model) answer alike: an update, a change of credits and a delete of one
resource of the caller's organization, named by a path UUID, and the ETag on the
answer that shows it.

Each runs its steps in the order that decides which refusal a bad request gets:
the caller (its organization; the route's permission was checked before the view
ran), the path's UUID, the body and its validation, then the domain's transaction
with the If-Match tags, the actor its activity records and the time.
"""

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from aiohttp import hdrs, web
from marshmallow import Schema

from keysvc.db.contract import Store
from keysvc.http.envelope import ok
from keysvc.http.keyfields import CreditsChangeSchema
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, STORE
from keysvc.http.views.common import actor, authorized, if_match, path_uuid, read_json_object
from keysvc.models import Actor, Key

T = TypeVar("T")

_credits = CreditsChangeSchema()


# The domain's calls, as (store, caller, organization, the path's id, ..., actor, now):
# the update body's validation (with the checks the rules make before it), the
# update with the If-Match tags, the change of credits, and the delete with the tags.
Validate = Callable[[Store, Key, str, str, dict[str, Any], datetime], Awaitable[dict[str, Any]]]
Update = Callable[
    [Store, Key, str, str, dict[str, Any], list[str] | None, Actor, datetime], Awaitable[T]
]
CreditsChange = Callable[[Store, Key, str, str, dict[str, Any], Actor, datetime], Awaitable[T]]
Delete = Callable[[Store, Key, str, str, list[str] | None, Actor, datetime], Awaitable[None]]


def validated_by(schema: Schema) -> Validate:
    """The ``Validate`` of an update whose body only its schema checks."""

    async def validate(
        store: Store, caller: Key, organization_id: str, target_id: str, body: dict[str, Any],
        now: datetime, /,
    ) -> dict[str, Any]:  # fmt: skip
        return load(schema, body)

    return validate


async def update(request: web.Request, id_name: str, validate: Validate, write: Update[T]) -> T:
    """The resource named by the path parameter ``id_name``, updated by the body."""
    caller, organization_id = authorized(request)
    target_id, store = path_uuid(request, id_name), request.app[STORE]
    body = await read_json_object(request)
    now = request.app[CLOCK]()
    data = await validate(store, caller, organization_id, target_id, body, now)
    tags = if_match(request)
    return await write(store, caller, organization_id, target_id, data, tags, actor(request), now)


async def change_credits(request: web.Request, id_name: str, change: CreditsChange[T]) -> T:
    """The resource named by ``id_name``, its credits set or incremented by the body."""
    caller, organization_id = authorized(request)
    target_id = path_uuid(request, id_name)
    data = load(_credits, await read_json_object(request))
    return await change(
        request.app[STORE], caller, organization_id, target_id, data, actor(request),
        request.app[CLOCK](),
    )  # fmt: skip


async def delete(request: web.Request, id_name: str, remove: Delete) -> web.Response:
    """The resource named by ``id_name`` deleted: the envelope with no result."""
    caller, organization_id = authorized(request)
    target_id = path_uuid(request, id_name)
    tags, now = if_match(request), request.app[CLOCK]()
    await remove(request.app[STORE], caller, organization_id, target_id, tags, actor(request), now)
    return ok(request)


def tagged(response: web.Response, etag: str) -> web.Response:
    """``response`` with the resource's ETag, for a later If-Match. The tag is quoted hex
    already, as the ETag setter would write it: it is set as it is."""
    response.headers[hdrs.ETAG] = etag
    return response
