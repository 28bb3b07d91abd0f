"""The routes of identities (issue 36), declared as ``keysvc.http.routes`` declares the
others; ``routes.ROUTES`` lists them in the document's order."""

from keysvc.http import identity_schemas as ids
from keysvc.http.keyfields import CreditsChangeSchema
from keysvc.http.routing import AUTHENTICATED, DONE, ORG, WRITE, Route

IDENTITIES_PATH, IDENTITY_PATH = ORG + "/identities", ORG + "/identities/{identityId}"

_IDENTITY = "The identity."
_ESCALATION = (
    " The caller must hold every permission that any of the identity's keys holds, and a "
    "key may not change the credits or limits of its own identity."
)
LIST_IDENTITIES = Route(
    "GET",
    IDENTITIES_PATH,
    "keysvcIdentityList",
    "Get the organization's identities, oldest first (keysvc addition)",
    tag="identities",
    permission="identities:read",
    response=ids.IdentitySchema,
    paged="identities",
    query=ids.IdentityQuerySchema,
    answer="Identities.",
    statuses=AUTHENTICATED,
    description=(
        "Needs the permission `identities:read`. keysvc addition. In pages of `limit`; "
        "with `externalId`, only the identity of that externalId (none or one)."
    ),
)
CREATE_IDENTITY = Route(
    "POST",
    IDENTITIES_PATH,
    "keysvcIdentityCreate",
    "Create an identity (keysvc addition)",
    tag="identities",
    permission="identities:write",
    body=ids.CreateIdentitySchema,
    response=ids.IdentitySchema,
    answer=_IDENTITY,
    statuses=(*WRITE, 409),
    description=(
        "Needs the permission `identities:write`. keysvc addition. The organization's keys "
        "whose externalId is the identity's belong to it and share its credits and "
        "ratelimits. 409 when the organization has an identity with this externalId "
        "already. A key created or changed with an externalId that no identity has yet "
        "makes one, with no limits. Keys that carry the externalId already join it: the "
        "caller must hold every permission they hold (403). Recorded as an "
        "`identity_create` activity."
    ),
)
GET_IDENTITY = Route(
    "GET",
    IDENTITY_PATH,
    "keysvcIdentityGet",
    "Get identity details (keysvc addition)",
    tag="identities",
    permission="identities:read",
    response=ids.IdentitySchema,
    answer=_IDENTITY,
    statuses=(*AUTHENTICATED, 404),
)
UPDATE_IDENTITY = Route(
    "PATCH",
    IDENTITY_PATH,
    "keysvcIdentityUpdate",
    "Update an identity's meta, credits or ratelimits (keysvc addition)",
    tag="identities",
    permission="identities:write",
    body=ids.UpdateIdentitySchema,
    response=ids.IdentitySchema,
    answer=_IDENTITY,
    statuses=(*WRITE, 404, 412),
    if_match=True,
    description=(
        "Needs the permission `identities:write`. keysvc addition. Each field given "
        "replaces the identity's (null clears it); externalId never changes. With "
        "If-Match, only if the identity's ETag is among those given (412 otherwise)."
        + _ESCALATION
        + " Recorded as an `identity_update` activity with the fields before and after."
    ),
)
DELETE_IDENTITY = Route(
    "DELETE",
    IDENTITY_PATH,
    "keysvcIdentityDelete",
    "Delete an identity; its keys stay (keysvc addition)",
    tag="identities",
    permission="identities:write",
    answer=DONE,
    statuses=(*WRITE, 404, 412),
    if_match=True,
    description=(
        "Needs the permission `identities:write`. keysvc addition. The identity's keys stay, "
        "with their externalId, and share nothing any more: each has its own credits and "
        "limits only. A key created or changed later with that externalId makes a new "
        "identity." + _ESCALATION
    ),
)
CHANGE_IDENTITY_CREDITS = Route(
    "POST",
    IDENTITY_PATH + "/credits",
    "keysvcIdentityCredits",
    "Change the identity's credits (keysvc addition)",
    tag="identities",
    permission="identities:write",
    body=CreditsChangeSchema,
    response=ids.IdentitySchema,
    answer=_IDENTITY,
    statuses=(*WRITE, 404, 409),
    description=(
        "Needs the permission `identities:write`. keysvc addition. Exactly one of `set` "
        "(a number, or null for unlimited; the refill stays), `increment` or `decrement` "
        "(never below 0), applied in one transaction with any refill due applied first, "
        "as for a key's credits. 409 to increment or decrement unlimited credits." + _ESCALATION
    ),
)
IDENTITY_ROUTES = (
    LIST_IDENTITIES, CREATE_IDENTITY, GET_IDENTITY, UPDATE_IDENTITY, DELETE_IDENTITY,
    CHANGE_IDENTITY_CREDITS,
)  # fmt: skip
