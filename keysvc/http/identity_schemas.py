"""The bodies, query and answer of the identity routes (issue 36), as
``keysvc.http.schemas`` has the keys' (kept apart to keep each module small).

An identity's ``meta`` and ``credits`` follow the key's rules (``keysvc.http.keyfields``),
its ``ratelimits`` the named limits' (``named_limits_field``); its ``externalId`` is a
name, set at its create and never changed.
"""

from marshmallow import Schema, fields

from keysvc.http.keyfields import (
    CREDITS_DOC,
    META_DOC,
    CreditsSchema,
    Meta,
    NamedLimitSchema,
    named_limits_field,
)
from keysvc.http.queries import ListKeysQuerySchema
from keysvc.http.responses import ApiKeySchema
from keysvc.http.schemas import Name

EXTERNAL_ID_DOC = (
    "Your own ID for who the identity is (a customer, tenant or user), 1 to 255 characters "
    "as a name, unique in the organization and never changed. The organization's keys with "
    "this externalId are the identity's."
)
_NULL_CLEARS = " On PATCH, null clears it."


class CreateIdentitySchema(Schema):
    externalId = Name(required=True, metadata={"description": EXTERNAL_ID_DOC})
    meta = Meta(metadata={"description": META_DOC, "type": "object"})
    credits = fields.Nested(
        CreditsSchema,
        allow_none=True,
        metadata={
            **CREDITS_DOC,
            "description": "null (or absent) means unlimited; with credits, every verify of "
            "one of the identity's keys spends from them.",
        },
    )
    ratelimits = named_limits_field()


class UpdateIdentitySchema(Schema):
    """Every field optional; each given replaces (null clears). externalId never changes."""

    meta = Meta(metadata={"description": META_DOC + _NULL_CLEARS, "type": "object"})
    credits = fields.Nested(
        CreditsSchema,
        allow_none=True,
        metadata={"description": "The identity's credits; null: unlimited."},
    )
    ratelimits = named_limits_field(allow_none=True)


class IdentityQuerySchema(Schema):
    """The identity list's filter."""

    externalId = Name(metadata={"description": "Only the identity with this externalId."})


class ListIdentitiesQuerySchema(ListKeysQuerySchema, IdentityQuerySchema):
    """The identity list's query: paging (as the key list's), and the externalId filter."""


_CREDITS = ApiKeySchema._declared_fields["credits"].metadata


class IdentitySchema(Schema):
    """An identity as answered (``keysvc.domain.identities.identity_view``)."""

    id = fields.String(metadata={"format": "uuid"})
    externalId = fields.String(metadata={"description": EXTERNAL_ID_DOC})
    meta = fields.Dict(allow_none=True, metadata={"description": META_DOC})
    credits = fields.Raw(
        allow_none=True,
        metadata={**_CREDITS, "description": "null: unlimited."},
    )
    ratelimits = fields.List(fields.Nested(NamedLimitSchema))
    createdAt = fields.String(metadata={"format": "date-time"})
    updatedAt = fields.String(metadata={"format": "date-time"})
