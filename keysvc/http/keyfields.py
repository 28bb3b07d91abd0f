"""Request fields of issue 29 on keys: ``meta`` (a JSON object, at most 4 KiB
serialized), ``credits`` (null, or remaining and a refill) and the body of
``POST .../keys/{keyId}/credits`` (exactly one of set, increment, decrement).
``externalId`` is a ``keysvc.http.schemas.Name``: the same rules as a name.
"""

import json
from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from keysvc.domain.credits import DAILY, INTERVALS, MAX_CREDITS, MONTHLY
from keysvc.domain.limits import MAX_META_DEPTH
from keysvc.domain.namedlimits import MAX_LIMIT, MAX_NAMED_LIMITS, MAX_WINDOW_SECONDS, NAME_PATTERN
from keysvc.nesting import depth_of

MAX_META_BYTES = 4096
ADDED = {"x-keysvc-addition": True}
EXTERNAL_ID_DOC = (
    "keysvc addition: your own ID for who the key is for (a customer, tenant or user), "
    "1 to 255 characters as a name; several keys may share one. Filter the list with "
    "?externalId=."
)
# The key list's filter, as the OpenAPI document states it (keysvc.http.openapi).
EXTERNAL_ID_PARAM = {
    "in": "query",
    "name": "externalId",
    "description": "keysvc addition: only the keys with this externalId.",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "x-keysvc-addition": True,
}
META_DOC = (
    f"keysvc addition: a JSON object for your own use, at most 4 KiB and {MAX_META_DEPTH}"
    " levels deep (itself included); returned as given."
)
_RANGE = "must be an integer from {min} to {max}"


class _Count(fields.Integer):
    """An integer as JSON Schema has it: 5 and 5.0 alike, never 5.5, "5" or true."""

    def _validated(self, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return super()._validated(value)


def _count(low: int, high: int = MAX_CREDITS, **kwargs: Any) -> fields.Integer:
    """A count from ``low`` to ``high``."""
    return _Count(strict=True, validate=validate.Range(low, high, error=_RANGE), **kwargs)


class Meta(fields.Field[dict[str, Any] | None]):
    """A JSON object kept and answered as given, at most ``MAX_META_BYTES`` as compact
    UTF-8 JSON and ``MAX_META_DEPTH`` levels deep (measured first, without recursion:
    ``keysvc.nesting``); null on PATCH clears it."""

    def __init__(self, **kwargs: Any):
        super().__init__(allow_none=True, **kwargs)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValidationError("must be a JSON object")
        depth = depth_of(value)
        if depth > MAX_META_DEPTH:
            raise ValidationError(
                f"must nest at most {MAX_META_DEPTH} levels of objects and arrays,"
                f" itself included ({depth} given)"
            )
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_META_BYTES:
            raise ValidationError(f"must be at most {MAX_META_BYTES} bytes as JSON ({size} given)")
        return value


class RefillSchema(Schema):
    interval = fields.String(
        required=True,
        validate=validate.OneOf(INTERVALS, error="must be one of: daily, monthly"),
    )
    amount = _count(1, required=True)
    refillDay = _count(
        1,
        31,
        metadata={
            "description": "monthly only: the day of the month (default 1); past the month's"
            " end, its last day"
        },
    )

    @validates_schema
    def _day_monthly(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("interval") == DAILY and "refillDay" in data:
            raise ValidationError("is for a monthly refill only", "refillDay")
        if data.get("interval") == MONTHLY:
            data.setdefault("refillDay", 1)


CREDITS_DOC = {
    **ADDED,
    "description": "keysvc addition: null (or absent) means unlimited. A refill sets remaining "
    "to its amount at 00:00 UTC of its day, applied on the next use or read.",
}


class CreditsSchema(Schema):
    remaining = _count(0, required=True)
    refill = fields.Nested(RefillSchema, allow_none=True, load_default=None)


class CreditsChangeSchema(Schema):
    """``POST .../keys/{keyId}/credits``: exactly one of set (null: unlimited),
    increment or decrement."""

    set = _count(
        0, allow_none=True, metadata={"description": "The new remaining; null: unlimited."}
    )
    increment = _count(1)
    decrement = _count(1)

    @validates_schema
    def _exactly_one(self, data: dict[str, Any], **kwargs: Any) -> None:
        if len(data) != 1:
            raise ValidationError("give exactly one of set, increment, decrement", "set")


class BoundedList(fields.List[Any]):
    """A list whose length is checked before its entries: ten thousand bad
    entries get one error that names the limit, not ten thousand errors."""

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> list[Any]:
        if isinstance(value, list):
            for validator in self.validators:
                if isinstance(validator, validate.Length):
                    validator(value)
        return super()._deserialize(value, attr, data, **kwargs)


def _unique_names(entries: list[dict[str, Any]]) -> None:
    names = [entry["name"] for entry in entries]
    if len(set(names)) != len(names):
        raise ValidationError("names must be unique")


def _limit_name(value: str) -> None:
    if not NAME_PATTERN.fullmatch(value):
        raise ValidationError("must be 1 to 64 of a-z, 0-9, _, . and -")


class NamedLimitSchema(Schema):
    """One named rate limit (issue 36, ``keysvc.domain.namedlimits``)."""

    name = fields.String(
        required=True, validate=_limit_name, metadata={"pattern": f"^{NAME_PATTERN.pattern}$"}
    )
    limit = _count(1, MAX_LIMIT, required=True)
    windowSeconds = _count(1, MAX_WINDOW_SECONDS, required=True)
    autoApply = fields.Boolean(load_default=False)


NAMED_LIMITS_DOC = {
    **ADDED,
    "description": "keysvc addition: named rate limits. An autoApply limit is counted on "
    "every verify; the others only when the verify names them (X-Ratelimit or "
    "?ratelimit=). A key's limit of a name comes before its identity's.",
}


def named_limits_field(**kwargs: Any) -> "BoundedList":
    """The ``ratelimits`` field of a key or an identity: at most MAX_NAMED_LIMITS,
    names unique."""
    return BoundedList(
        fields.Nested(NamedLimitSchema),
        validate=[
            validate.Length(max=MAX_NAMED_LIMITS, error="must have at most {max} entries"),
            _unique_names,
        ],
        metadata=NAMED_LIMITS_DOC,
        **kwargs,
    )
