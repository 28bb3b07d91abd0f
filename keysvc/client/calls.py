"""Every call the client makes, as a ``keysvc.client.wire.Call``: the management API's
keys, credits and roles (the paths and field names of keysvc's OpenAPI document,
``/v1/openapi.json``), whoami, and ``/v1/verify``. Bodies are the API's own JSON
objects, passed through as given: the server validates them and its 400 names the
field."""

from collections.abc import Mapping
from typing import TypedDict, Unpack

from keysvc.client.records import (
    Caller,
    JsonObject,
    Page,
    Tagged,
    caller_from_headers,
    caller_from_json,
)
from keysvc.client.wire import Answer, Call, segment


def _result(answer: Answer) -> JsonObject:
    result: JsonObject = answer.json()["result"]
    return result


def _nothing(answer: Answer) -> None:
    return None


def _tagged(answer: Answer) -> Tagged:
    return Tagged(_result(answer), answer.headers.get("ETag"))


def _page(answer: Answer) -> Page:
    body = answer.json()
    return Page(body["result"], body.get("nextCursor"), body.get("totalCount"))


def _org(organization_id: str) -> str:
    return "/v1/organizations/" + segment(organization_id)


def _key(organization_id: str, key_id: str) -> str:
    return f"{_org(organization_id)}/keys/{segment(key_id)}"


def _role(organization_id: str, role_id: str) -> str:
    return f"{_org(organization_id)}/roles/{segment(role_id)}"


def _paging(limit: int | None, cursor: str | None) -> dict[str, str]:
    query = {} if limit is None else {"limit": str(limit)}
    return query if cursor is None else {**query, "cursor": cursor}


def _if_match(etag: str | None) -> dict[str, str]:
    return {} if etag is None else {"If-Match": etag}


def list_keys(organization_id: str, limit: int | None, cursor: str | None) -> Call[Page]:
    return Call("GET", _org(organization_id) + "/keys", _page, _paging(limit, cursor))


def create_key(organization_id: str, body: JsonObject) -> Call[JsonObject]:
    return Call("POST", _org(organization_id) + "/keys", _result, body=body)


def get_key(organization_id: str, key_id: str) -> Call[Tagged]:
    return Call("GET", _key(organization_id, key_id), _tagged)


def update_key(
    organization_id: str, key_id: str, changes: JsonObject, if_match: str | None
) -> Call[Tagged]:
    path = _key(organization_id, key_id)
    return Call("PATCH", path, _tagged, body=changes, headers=_if_match(if_match))


def delete_key(organization_id: str, key_id: str, if_match: str | None) -> Call[None]:
    return Call("DELETE", _key(organization_id, key_id), _nothing, headers=_if_match(if_match))


def rotate_key(organization_id: str, key_id: str, body: JsonObject | None) -> Call[JsonObject]:
    return Call("POST", _key(organization_id, key_id) + "/rotate", _result, body=body)


def change_credits(organization_id: str, key_id: str, change: JsonObject) -> Call[Tagged]:
    return Call("POST", _key(organization_id, key_id) + "/credits", _tagged, body=change)


def key_usage(organization_id: str, key_id: str, query: Mapping[str, str]) -> Call[JsonObject]:
    return Call("GET", _key(organization_id, key_id) + "/usage", _result, dict(query))


def list_roles(organization_id: str, limit: int | None, cursor: str | None) -> Call[Page]:
    return Call("GET", _org(organization_id) + "/roles", _page, _paging(limit, cursor))


def create_role(organization_id: str, body: JsonObject) -> Call[JsonObject]:
    return Call("POST", _org(organization_id) + "/roles", _result, body=body)


def get_role(organization_id: str, role_id: str) -> Call[JsonObject]:
    return Call("GET", _role(organization_id, role_id), _result)


def update_role(organization_id: str, role_id: str, changes: JsonObject) -> Call[JsonObject]:
    return Call("PATCH", _role(organization_id, role_id), _result, body=changes)


def delete_role(organization_id: str, role_id: str) -> Call[None]:
    return Call("DELETE", _role(organization_id, role_id), _nothing)


def whoami() -> Call[JsonObject]:
    return Call("GET", "/v1/whoami", _result)


class Requirements(TypedDict, total=False):
    """What a verify request asks of the caller's key, beside its Authorization:
    ``permission`` it must hold, ``organization`` it must belong to, the ``cost`` in
    credits to spend, the client's address (``forwarded_for``, for IP access lists,
    when keysvc trusts the asker), and ``full``: the JSON answer (name and meta too),
    which keysvc says may not be reused."""

    permission: str | None
    organization: str | None
    cost: int | None
    forwarded_for: str | None
    full: bool


def verify_headers(**asked: Unpack[Requirements]) -> dict[str, str]:
    """The headers of a verify request beside Authorization: only what the asker sets,
    never anything a client sent."""
    headers = {"Accept": "application/json" if asked.get("full") else "*/*"}
    cost = asked.get("cost")
    for name, value in (
        ("X-Required-Permission", asked.get("permission")),
        ("X-Required-Organization", asked.get("organization")),
        ("X-Credit-Cost", None if cost is None else str(cost)),
        ("X-Forwarded-For", asked.get("forwarded_for")),
    ):
        if value is not None:
            headers[name] = value
    return headers


def read_caller(answer: Answer) -> Caller:
    """The caller of a 200 verify answer, from its JSON body when it has one."""
    if answer.body:
        return caller_from_json(_result(answer))
    return caller_from_headers(answer.headers)


def verify(**asked: Unpack[Requirements]) -> Call[Caller]:
    """Verify's question; the Authorization it asks about is the caller's, given to send.
    A POST (keysvc answers verify on any method): a verify with a cost spends credits,
    and neither aiohttp nor a proxy sends a POST again after its answer was lost."""
    return Call("POST", "/v1/verify", read_caller, headers=verify_headers(**asked))
