"""The bodies of the webhook controls (keysvc additions): a webhook's PATCH (enable or
disable it) and its secret's rotation; ``keysvc.http.schemas`` holds the create."""

from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from keysvc.domain.limits import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from keysvc.http.schemas import WholeNumber


class JsonBoolean(fields.Boolean):
    """JSON true or false only: not marshmallow's "yes", "on", 1 or 0."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ValidationError("must be true or false")
        return value


class UpdateWebhookSchema(Schema):
    """The webhook PATCH body (keysvc addition): enable or disable it."""

    enabled = JsonBoolean(
        required=True,
        metadata={
            "description": "false disables the webhook (it is sent nothing); true enables it"
            " again and resets its failure clock (KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS)."
        },
    )


class RotateWebhookSecretSchema(Schema):
    """The rotate-secret body (keysvc addition), optional as a whole."""

    overlapSeconds = WholeNumber(
        load_default=DEFAULT_SECRET_OVERLAP,
        validate=validate.Range(
            0, MAX_SECRET_OVERLAP, error="must be an integer from {min} to {max} (7 days)"
        ),
        metadata={
            "description": "How long the replaced secret still signs deliveries beside the new"
            " one, in seconds (default 86400, a day; 0: it stops at once).",
        },
    )
