"""Marshmallow schemas of query strings: the lists' paging (``limit``, ``cursor``),
the activity list's dates and the usage series' range. Loaded with
``keysvc.http.schemas.load``, as bodies are, so that their errors read alike.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from marshmallow import Schema, fields, validate

from keysvc.domain.limits import MAX_USAGE_BUCKETS
from keysvc.http.schemas import MAX_PAGE, Name, in_utc


class QueryInteger(fields.Integer):
    """An integer in the query string: ASCII digits only (int() alone takes "5_0", "①")."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> int:
        if not (isinstance(value, str) and value.isascii() and value.isdigit()):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class _PageQuerySchema(Schema):
    limit = QueryInteger(
        load_default=MAX_PAGE,
        strict=False,
        validate=validate.Range(1, MAX_PAGE, error="must be an integer from {min} to {max}"),
        error_messages={"invalid": f"must be an integer from 1 to {MAX_PAGE}"},
    )


class ListKeysQuerySchema(_PageQuerySchema):
    # Only the shape here (keysvc.domain.keys.decode_cursor checks the signature): text
    # such as "²" passes str.isdigit() but not int().
    cursor = fields.String(
        validate=validate.Regexp(
            r"[0-9]{1,18}\.[0-9A-Za-z_-]+\Z",
            error="not a cursor from this list; start again without it",
        )
    )


class ExternalIdQuerySchema(Schema):
    """The key list's filter (issue 29): only the keys of one externalId."""

    externalId = Name(
        metadata={
            "x-keysvc-addition": True,
            "description": "keysvc addition: only the keys with this externalId.",
        }
    )


class KeyListQuerySchema(ListKeysQuerySchema, ExternalIdQuerySchema):
    """The key list's query: paging, and the externalId filter."""


class ListRolesQuerySchema(_PageQuerySchema):
    # Only the shape here (keysvc.domain.roles.decode_cursor checks the signature): a role's
    # position is its name, up to MAX_NAME characters of up to 4 bytes, in base64.
    cursor = fields.String(
        validate=validate.Regexp(
            r"[0-9A-Za-z_-]{2,1400}\.[0-9A-Za-z_-]+\Z",
            error="not a cursor from this list; start again without it",
        )
    )


class QueryMoment(fields.Field[datetime]):
    """A date-time in the query string: ISO-8601 with an offset, in UTC."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> datetime:
        return in_utc(str(value), "2026-01-02T03:04:05Z")


USAGE_GRANULARITIES = ("minute", "hour", "day")


class UsageQuerySchema(Schema):
    """A key's usage query (``keysvc.domain.usage``): from (default: 24 hours before to; for
    minute, 1,440 minutes before to rounded up), to (default: now) and granularity
    (default: hour)."""

    start = QueryMoment(
        data_key="from",
        metadata={
            "description": "Start of the series, rounded down to its granularity;"
            " default: 24 hours before `to`, or for `minute` 1,440 minutes before `to`"
            " rounded up to a whole minute (the last 1,440 minutes, `to`'s included).",
            "examples": ["2026-01-02T00:00:00Z"],
        },
    )
    end = QueryMoment(
        data_key="to",
        metadata={
            "description": "End of the series, rounded up to its granularity; default: now.",
            "examples": ["2026-01-03T00:00:00Z"],
        },
    )
    granularity = fields.String(
        load_default="hour",
        validate=validate.OneOf(
            USAGE_GRANULARITIES, error="must be one of: " + ", ".join(USAGE_GRANULARITIES)
        ),
        metadata={
            "description": "Width of each bucket (default: hour); at most "
            f"{MAX_USAGE_BUCKETS} buckets in all.",
            "enum": list(USAGE_GRANULARITIES),
        },
    )


class ListActivitiesQuerySchema(ListKeysQuerySchema):
    """Upstream's from_date and to_date (both included), keysvc's paging, and its
    ``include=keysvc``, which lists keysvc's kinds of record too."""

    from_date = QueryMoment()
    to_date = QueryMoment()
    include = fields.String(
        validate=validate.Equal("keysvc", error="must be keysvc, for keysvc's activity types too")
    )


class ListDeliveriesQuerySchema(ListKeysQuerySchema):
    """A page of a webhook's deliveries: the same limit, and a cursor of the same shape."""
