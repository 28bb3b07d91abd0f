"""What the OpenAPI document says of issue 29's additions: to ``/v1/verify``
(``keysvc.http.views.verify``) the cost it spends, the headers of an answer about a
key with credits or an externalId, and the JSON answer ``Accept: application/json``
gets; to the key schemas, the rules their fields check in Python (``tighten``).
``keysvc.http.openapi`` puts them in the document."""

from typing import Any

from keysvc.domain.credits import MAX_COST
from keysvc.domain.namedcount import MAX_HEADER
from keysvc.domain.namedlimits import MAX_NAMED_LIMITS

_STRING = {"type": "string"}
_COST = {"type": "integer", "minimum": 0, "maximum": MAX_COST, "default": 1}
# One ?ratelimit= item as keysvc.domain.namedcount reads it: a name, then maybe ":" and
# a cost of at most seven ASCII digits, 0 to 1,000,000.
_LIMIT_COST = "([0-9]{1,6}|0[0-9]{6}|1000000)"
RATELIMIT_ITEM = rf"^[a-z0-9_.-]{{1,64}}(:{_LIMIT_COST})?$"
# The X-Ratelimit header as it reads it: comma-separated items, each ``name`` or
# ``name;cost=N``, spaces allowed around each part; or blank (nothing named).
_HEADER_ITEM = rf"[ \t]*[a-z0-9_.-]{{1,64}}[ \t]*(;[ \t]*cost[ \t]*=[ \t]*{_LIMIT_COST}[ \t]*)?"
RATELIMIT_HEADER = rf"^({_HEADER_ITEM}(,{_HEADER_ITEM})*|[ \t]*)$"

VERIFY_PARAMS: list[dict[str, Any]] = [
    {
        "in": "header",
        "name": "X-Credit-Cost",
        "required": False,
        "description": "Credits this request spends from a key with credits (default 1; 0 "
        "checks without spending), once every other check has passed. Given both here and "
        "in ?cost=, the larger counts: a client header cannot lower a proxy's cost.",
        "schema": _COST,
        "x-keysvc-addition": True,
    },
    {
        "in": "query",
        "name": "cost",
        "required": False,
        "description": "The same, for proxies that cannot set a header.",
        "schema": _COST,
        "x-keysvc-addition": True,
    },
    {
        "in": "header",
        "name": "X-Ratelimit",
        "required": False,
        "description": "Named rate limits of the key to count this request against, each "
        "`name` or `name;cost=N` (cost 0 to 1000000, default 1; 0 checks without "
        "counting), comma-separated or on several lines, at most "
        f"{MAX_NAMED_LIMITS} names and {MAX_HEADER} characters. The key's autoApply limits "
        "are counted anyway. A name the key has no limit of is a 400. Not read when "
        "?ratelimit= names any: a client header cannot change what a proxy names.",
        "schema": {
            "type": "string",
            "maxLength": MAX_HEADER,
            "pattern": RATELIMIT_HEADER,
            "example": "tokens;cost=512",
        },
        "x-keysvc-addition": True,
    },
    {
        "in": "query",
        "name": "ratelimit",
        "required": False,
        "description": "The same, one `name` or `name:cost` each (repeatable); when given, "
        "X-Ratelimit is not read.",
        "schema": {
            "type": "array",
            "items": {"type": "string", "pattern": RATELIMIT_ITEM},
            "maxItems": MAX_NAMED_LIMITS,
        },
        "style": "form",
        "explode": True,
        "x-keysvc-addition": True,
    },
]

VERIFY_HEADERS: dict[str, Any] = {
    "X-Key-External-Id": {
        "description": "The key's externalId, when it has one, as percent-encoded UTF-8 "
        "(every byte outside printable ASCII, and every `%`): always ASCII; percent-decode "
        "it to read it back",
        "schema": _STRING,
    },
    "X-Credits-Remaining": {
        "description": "A key with credits: what remains after this request's cost",
        "schema": {"type": "integer"},
    },
    "X-Credits-Identity-Remaining": {
        "description": "A key whose identity has credits (issue 36): what the identity has "
        "left after this request's cost",
        "schema": {"type": "integer"},
    },
    "Cache-Control": {
        "description": "no-store on every answer about a key with credits: no proxy may reuse it",
        "schema": _STRING,
    },
    "X-Accel-Expires": {
        "description": "0 on every answer about a key with credits (nginx: never cache it)",
        "schema": _STRING,
    },
}

# The 200's body with Accept: application/json (without it, the body is empty, so it
# is stated as an extension of the response rather than as its content).
VERIFY_JSON: dict[str, Any] = {
    "x-keysvc-json-answer": {
        "schema": {
            "type": "object",
            "properties": {
                "status": {"type": "integer"},
                "requestId": {"type": "string", "format": "uuid"},
                "result": {
                    "type": "object",
                    "properties": {
                        "keyId": {"type": "string", "format": "uuid"},
                        "organizationId": {"type": "string", "format": "uuid"},
                        "name": _STRING,
                        "externalId": {"type": ["string", "null"]},
                        "meta": {"type": ["object", "null"]},
                        "permissions": {"type": "array", "items": _STRING},
                        "credits": {
                            "type": "object",
                            "description": "A key with credits only",
                            "properties": {"remaining": {"type": "integer"}},
                        },
                        "ratelimits": {
                            "type": "array",
                            "description": "Every named rate limit checked (issue 36)",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": _STRING,
                                    "limit": {"type": "integer"},
                                    "remaining": {"type": "integer"},
                                    "reset": {"type": "integer"},
                                    "exceeded": {"type": "boolean"},
                                },
                            },
                        },
                        "identityCredits": {
                            "type": "object",
                            "description": "A key whose identity has credits only",
                            "properties": {"remaining": {"type": "integer"}},
                        },
                        "identity": {
                            "type": "object",
                            "description": "The identity the key belongs to, when it has one",
                            "properties": {
                                "id": {"type": "string", "format": "uuid"},
                                "externalId": _STRING,
                                "meta": {"type": ["object", "null"]},
                            },
                        },
                        "ratelimit": {
                            "type": "object",
                            "description": "When a request limit applies",
                            "properties": {
                                "limit": {"type": "integer"},
                                "remaining": {"type": "integer"},
                                "reset": {"type": "integer"},
                            },
                        },
                    },
                },
            },
        }
    }
}


def tighten(schemas: dict[str, Any], name: dict[str, Any]) -> None:
    """Add the rules issue 29's request fields check in Python: externalId is a name
    (``name``'s pattern), refillDay is for a monthly refill only, and the credits body
    names exactly one change."""
    for body in ("ApiKeyPostRequest", "ApiKeyPatchRequest"):
        schemas[body]["properties"]["externalId"]["pattern"] = name["pattern"]
    daily = {"properties": {"interval": {"const": "daily"}}}
    schemas["Refill"].update({"if": daily, "then": {"not": {"required": ["refillDay"]}}})
    schemas["ApiKeyCreditsRequest"].update(minProperties=1, maxProperties=1)
