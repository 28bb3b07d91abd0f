"""Marshmallow schemas of request bodies, and the fields they share with the query
strings' (``keysvc.http.queries``).

They reject unknown fields (marshmallow's default) and say, per field, what is
wrong; ``load`` turns those messages into one readable ``BadRequest`` such as
``name: must be 1 to 255 characters``. The response shapes are in
``keysvc.http.responses``.
"""

import ipaddress
import re
import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from marshmallow import (
    Schema,
    ValidationError,
    fields,
    validate,
    validates,
)

from keysvc.credentials import SUFFIX_LENGTH, is_sha256_b64
from keysvc.domain.addresses import kept_source
from keysvc.domain.limits import DEFAULT_EXPIRING_DAYS, MAX_ROLE_IDS, MAX_WEBHOOK_URL
from keysvc.errors import BadRequest
from keysvc.http.keyfields import (
    CREDITS_DOC,
    EXTERNAL_ID_DOC,
    META_DOC,
    CreditsSchema,
    Meta,
    named_limits_field,
)
from keysvc.http.keyfields import BoundedList as BoundedList
from keysvc.timeutil import to_text

LEGACY_ROLES = ("admin", "developer", "query_endpoints")
KEY_STATES = ("enabled", "disabled")
MAX_NAME = 255
MAX_DESCRIPTION = 255
MAX_IP_ENTRIES = 100
MAX_PERMISSIONS = 100
MAX_ACTORS = 1000
MAX_PAGE = 250
# Upstream's database grants, which keysvc refuses whatever their number: the bound
# only keeps a long list from being read entry by entry before it is refused.
MAX_GRANTS = 100
# Longest field name an error message quotes.
MAX_FIELD_NAME = 64
MAX_MESSAGES = 10  # field errors listed in one answer
ROLE_TYPES = ("system", "custom")
# Metadata for the OpenAPI document (keysvc.http.openapi): formats as the upstream
# contract spells them, and ``x-keysvc-addition`` on fields upstream lacks.
UUID_TEXT = {"format": "uuid"}
ADDITION = {"x-keysvc-addition": True}


# A UUID in canonical lowercase form: the only form keysvc accepts in paths and actors.
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _has_control(value: str) -> bool:
    if value.isascii() and value.isprintable():  # most names: no character to look up
        return False
    return any(unicodedata.category(ch) == "Cc" for ch in value)


# Characters that are not shown, or not as themselves, but change how the text around
# them reads: format characters (category Cf: bidi marks, embeddings, overrides and
# isolates, zero-width characters, the soft hyphen, tags), line and paragraph
# separators (Zl, Zp), the combining grapheme joiner and the Hangul fillers, which show
# as blank. "\u202eadmin" would show as "nimda", and "ad\u200bmin" as "admin".
# INVISIBLE is those of the Basic Multilingual Plane as a character class in the
# syntax both Python and JSON Schema read, so that the OpenAPI document says the same
# (tests/api/test_names.py checks it against unicodedata); the check itself also refuses
# the format characters beyond that plane, by category.
INVISIBLE = (
    r"\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u180e"
    r"\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0"
    r"\ufff9-\ufffb"
)
_INVISIBLE = re.compile(f"[{INVISIBLE}]")
_HIDDEN_CATEGORIES = frozenset(("Cf", "Zl", "Zp"))


def _hidden(value: str) -> str | None:
    """The first character of ``value`` that is not shown as itself, or None."""
    found = _INVISIBLE.search(value)
    if found is not None:
        return found.group()
    if value.isascii():
        return None
    return next((ch for ch in value if unicodedata.category(ch) in _HIDDEN_CATEGORIES), None)


def _unshowable(value: str) -> str | None:
    """Why ``value`` cannot be shown as it is, or None."""
    if _has_control(value):
        return "must not contain control characters"
    hidden = _hidden(value)
    if hidden is not None:
        return f"must not contain invisible or formatting characters such as U+{ord(hidden):04X}"
    return None


class Name(fields.String):
    """A name: trimmed, 1 to 255 characters, nothing that is not shown as itself."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if not 1 <= len(text) <= MAX_NAME:
            raise ValidationError(f"must be 1 to {MAX_NAME} characters")
        refusal = _unshowable(text)
        if refusal is not None:
            raise ValidationError(refusal)
        return text


class ExpireAt(fields.Field[datetime | None]):
    """An ISO-8601 date-time with an offset, normalised to UTC; null or "" mean never."""

    def __init__(self, **kwargs: Any):
        super().__init__(allow_none=True, **kwargs)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> datetime | None:
        if value == "":
            return None
        if not isinstance(value, str):
            raise ValidationError("must be an ISO-8601 date-time string, null or empty")
        return in_utc(value, "2030-01-01T00:00:00Z")


def in_utc(text: str, example: str) -> datetime:
    """The ISO-8601 date-time ``text``, which must carry an offset, in UTC. Printable
    ASCII only: ``fromisoformat`` reads up to a NUL and takes what came before it."""
    try:
        if not (text.isascii() and text.isprintable()):
            raise ValueError(text)
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(f"must be an ISO-8601 date-time such as {example}") from None
    if moment.tzinfo is None:
        raise ValidationError("must include a time zone offset, such as Z or +02:00")
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValidationError("is out of range") from None


class Timestamp(fields.Field[datetime]):
    """Dumps a datetime in keysvc's one text form (UTC, trailing Z)."""

    def _serialize(self, value: datetime | None, attr: str | None, obj: Any, **kwargs: Any) -> Any:
        return None if value is None else to_text(value)


class IpSource(fields.String):
    """An IPv4 or IPv6 address or CIDR, loaded in the form it is kept in
    (``keysvc.domain.addresses``): ``::ffff:10.0.0.0/104`` and ``10.0.0.0/255.0.0.0``
    as ``10.0.0.0/8``."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs)
        if "%" in text:
            raise ValidationError("must not carry an IPv6 zone ID")
        try:
            return kept_source(text)
        except ValueError:
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValidationError("must be an IPv4 or IPv6 address or CIDR") from None
        raise ValidationError(f"has host bits set; did you mean {kept_source(str(network))}?")


def _no_control(value: str) -> None:
    refusal = _unshowable(value)
    if refusal is not None:
        raise ValidationError(refusal)


def _sha256_b64(value: str) -> None:
    if not is_sha256_b64(value):
        raise ValidationError("Not a sha256sum")


def _suffix(value: str) -> None:
    if len(value) != SUFFIX_LENGTH or _has_control(value):
        raise ValidationError(f"must be the last {SUFFIX_LENGTH} characters of the key ID")


# The hosted API's description, and what keysvc makes of an empty list, which it leaves unsaid.
IP_ACCESS_LIST_DOC = (
    "List of IP addresses allowed to access the API using this key. An empty or absent "
    "list means no IP restriction (keysvc's reading; the hosted API's document does not say)."
)


class IpAccessListEntrySchema(Schema):
    source = IpSource(required=True)
    description = fields.String(
        validate=[
            validate.Length(max=MAX_DESCRIPTION, error="must be at most {max} characters"),
            _no_control,
        ]
    )


class HashDataSchema(Schema):
    keyIdHash = fields.String(required=True, validate=_sha256_b64)
    keyIdSuffix = fields.String(required=True, validate=_suffix)
    keySecretHash = fields.String(required=True, validate=_sha256_b64)


class WholeNumber(fields.Integer):
    """An integer as JSON Schema has it: 5 and 5.0 alike, never "5" or true."""

    def __init__(self, **kwargs: Any):
        super().__init__(strict=True, **kwargs)

    def _validated(self, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return super()._validated(value)


class RateLimitSchema(Schema):
    """keysvc addition: this key's own request limit, instead of the server's."""

    limit = WholeNumber(
        required=True,
        validate=validate.Range(1, 1_000_000, error="must be an integer from {min} to {max}"),
    )
    windowSeconds = WholeNumber(
        required=True,
        validate=validate.Range(1, 86_400, error="must be an integer from {min} to {max}"),
    )


RATE_LIMIT_DOC = {
    **ADDITION,
    "description": "keysvc addition: this key's own request limit; null on PATCH clears it.",
}


_LEGACY_ROLE = fields.String(
    validate=validate.OneOf(LEGACY_ROLES, error="must be one of: " + ", ".join(LEGACY_ROLES))
)
# Each legacy role once: there are only so many.
_LEGACY_ROLES_LENGTH = validate.Length(
    max=len(LEGACY_ROLES), error="must have at most {max} entries"
)


class _KeyFieldsSchema(Schema):
    """Fields that create and PATCH share. ``now`` is the clock reading that
    expireAt must be after."""

    name = Name()
    expireAt = ExpireAt()
    state = fields.String(
        validate=validate.OneOf(KEY_STATES, error="must be one of: enabled, disabled"),
    )
    roles = BoundedList(
        _LEGACY_ROLE,
        validate=_LEGACY_ROLES_LENGTH,
        metadata={"deprecated": True},
    )
    assignedRoleIds = BoundedList(
        fields.UUID(error_messages={"invalid_uuid": "must be a role UUID"}),
        validate=validate.Length(max=MAX_ROLE_IDS, error="must have at most {max} entries"),
    )
    ipAccessList = BoundedList(
        fields.Nested(IpAccessListEntrySchema),
        validate=validate.Length(max=MAX_IP_ENTRIES, error="must have at most {max} entries"),
        metadata={"description": IP_ACCESS_LIST_DOC},
    )
    rateLimit = fields.Nested(RateLimitSchema, allow_none=True, metadata=RATE_LIMIT_DOC)
    # Issue 29 (keysvc.http.keyfields): null on PATCH clears each.
    externalId = Name(allow_none=True, metadata={**ADDITION, "description": EXTERNAL_ID_DOC})
    meta = Meta(metadata={**ADDITION, "description": META_DOC, "type": "object"})
    credits = fields.Nested(CreditsSchema, allow_none=True, metadata=CREDITS_DOC)
    # Issue 36: null (or an empty list) on PATCH clears them, a list replaces them.
    ratelimits = named_limits_field(allow_none=True)

    def __init__(self, *, now: datetime, **kwargs: Any):
        super().__init__(**kwargs)
        self.now = now

    @validates("expireAt")
    def _in_future(self, value: datetime | None, data_key: str) -> None:
        if value is not None and value <= self.now:
            raise ValidationError("must be in the future")


class CreateKeySchema(_KeyFieldsSchema):
    """The create-key body."""

    name = Name(required=True)
    state = fields.String(
        load_default="enabled",
        validate=validate.OneOf(KEY_STATES, error="must be one of: enabled, disabled"),
    )
    hashData = fields.Nested(HashDataSchema)
    roles = BoundedList(
        _LEGACY_ROLE,
        validate=[
            _LEGACY_ROLES_LENGTH,
            validate.Length(min=1, error="must contain at least 1 element"),
        ],
        metadata={"deprecated": True},
    )


class PatchKeySchema(_KeyFieldsSchema):
    """The PATCH body: every field optional; roles and ipAccessList replace."""


# The longest grace period a rotation gives the credentials it replaces: 30 days.
MAX_GRACE_SECONDS = 30 * 86_400


class RotateKeySchema(Schema):
    """The rotate body (keysvc addition), optional as a whole: how long the replaced
    credentials keep working, and the new ones as ``hashData``, checked as on create."""

    gracePeriodSeconds = WholeNumber(
        load_default=0,
        validate=validate.Range(
            0, MAX_GRACE_SECONDS, error="must be an integer from {min} to {max} (30 days)"
        ),
        metadata={
            **ADDITION,
            "description": "How long the replaced credentials keep working, in seconds "
            "(default 0: they stop at once). A later rotation ends them at once.",
        },
    )
    hashData = fields.Nested(HashDataSchema, metadata=ADDITION)


# marshmallow's stock messages, said the way the rest of keysvc says things.
_PLAIN = {
    "Missing data for required field.": "is required",
    "Unknown field.": "is not a known field",
    "Field may not be null.": "must not be null",
    "Not a valid string.": "must be a string",
    "Not a valid list.": "must be an array",
    "Invalid input type.": "must be an object",
}


def _flatten(messages: Any, prefix: str = "") -> list[str]:
    if isinstance(messages, Mapping):
        out: list[str] = []
        for name, inner in messages.items():
            name = str(name)[:MAX_FIELD_NAME]  # a client's unknown field name is its own text
            path = prefix if name == "_schema" else f"{prefix}.{name}" if prefix else name
            out.extend(_flatten(inner, path))
        return out
    if isinstance(messages, list | tuple):
        texts = [
            _PLAIN.get(str(m), str(m))
            for m in messages
            if not isinstance(m, Mapping | list | tuple)
        ]
        nested = [m for m in messages if isinstance(m, Mapping | list | tuple)]
        out = [f"{prefix}: {text}" if prefix else text for text in texts]
        for inner in nested:
            out.extend(_flatten(inner, prefix))
        return out
    return [f"{prefix}: {messages}" if prefix else str(messages)]


def _entries_in_order(message: str) -> list[tuple[int, str]]:
    """Sort key: "roles.2" before "roles.10". Digit runs compare by length, then
    text, never through int(): a field name may hold thousands of digits."""
    parts = re.split(r"([0-9]+)", message)  # odd places hold the digit runs
    key: list[tuple[int, str]] = []
    for index, part in enumerate(parts):
        digits = part.lstrip("0") if index % 2 else None
        key.append((len(digits), digits) if digits is not None else (-1, part))
    return key


def load(schema: Schema, data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``data``; every problem, field by field, becomes one BadRequest."""
    try:
        result: dict[str, Any] = schema.load(data)
    except ValidationError as exc:
        messages = sorted(_flatten(exc.messages), key=_entries_in_order)
        # A body of many bad entries must not get an answer many times its size.
        shown = messages[:MAX_MESSAGES]
        if len(messages) > MAX_MESSAGES:
            shown.append(f"and {len(messages) - MAX_MESSAGES} more")
        raise BadRequest("; ".join(shown)) from None
    return result


# Webhooks (keysvc.domain.webhooks): the event types a subscription may name, and its bounds.
EVENT_TYPES = (
    "key.created",
    "key.updated",
    "key.deleted",
    "key.rotated",
    "key.expiring",
    "key.used_after_revoke",
    "key.leaked",
    "webhook.disabled",
    # Issue 29 (keysvc.domain.credits): sent in the spend's transaction.
    "key.credits_low",
    "key.credits_exhausted",
    # Issue 36 (keysvc.domain.keycredits): an identity's, its data the identity's id,
    # externalId and credits.
    "identity.credits_low",
    "identity.credits_exhausted",
)
MAX_EXPIRING_DAYS = 90


class CreateWebhookSchema(Schema):
    """The create-webhook body. The URL's scheme, host and addresses are checked by
    ``keysvc.domain.targets``."""

    url = fields.String(
        required=True,
        validate=validate.Length(
            1,
            MAX_WEBHOOK_URL,
            error="must be 1 to {max} characters, such as https://example.com/hooks",
        ),
        metadata={
            "format": "uri",
            "pattern": "^https?://",
            "description": "Where events are POSTed: http(s), no credentials, a public host"
            " (keysvc.domain.targets).",
        },
    )
    events = BoundedList(
        fields.String(
            validate=validate.OneOf(EVENT_TYPES, error="must be one of: " + ", ".join(EVENT_TYPES))
        ),
        required=True,
        validate=validate.Length(
            1, len(EVENT_TYPES), error="must name 1 to {max} event types, each once"
        ),
        metadata={"uniqueItems": True},
    )
    expiringDays = WholeNumber(
        load_default=DEFAULT_EXPIRING_DAYS,
        validate=validate.Range(
            1, MAX_EXPIRING_DAYS, error="must be an integer from {min} to {max}"
        ),
        metadata={"description": "How many days before a key's expireAt key.expiring is sent."},
    )

    @validates("events")
    def _each_once(self, value: list[str], data_key: str) -> None:
        if len(set(value)) != len(value):
            raise ValidationError("must name each event type once")
