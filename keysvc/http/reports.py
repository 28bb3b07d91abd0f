"""The bodies of leak reports (``keysvc.http.views.leaks``): revoke-by-secret's, and
GitHub secret scanning's array of tokens, with its feedback answer and the OpenAPI
operation that documents both as GitHub's format rather than keysvc's envelope."""

from typing import Any

from marshmallow import EXCLUDE, Schema, fields, validate

from keysvc.domain.limits import MAX_LEAKED_SECRET, MAX_SCANNING_TOKENS, MAX_WEBHOOK_URL
from keysvc.http.schemas import ADDITION, BoundedList
from keysvc.scanning import IDENTIFIER_HEADER, SIGNATURE_HEADER


class RevokeLeakedSchema(Schema):
    """The revoke-by-secret body (keysvc addition): the secret found leaked."""

    secret = fields.String(
        required=True,
        validate=validate.Length(
            1, MAX_LEAKED_SECRET, error=f"must be 1 to {MAX_LEAKED_SECRET} characters"
        ),
        metadata={
            **ADDITION,
            "description": "A key's secret, as found leaked. Never echoed, stored or logged.",
        },
    )


# GitHub secret scanning's report (keysvc.http.views.leaks): an array of these, which
# ``ScanningReportSchema`` loads as its ``tokens``. Fields GitHub may add later are left
# out, not refused: a report is GitHub's format, not keysvc's.
MAX_SCANNING_FIELD = 256


class ScanningTokenSchema(Schema):
    """One token GitHub found: the token, its type (the pattern that matched), where it
    was found (``url``, empty for some sources) and the kind of place (``source``)."""

    class Meta:
        unknown = EXCLUDE

    token = fields.String(
        required=True,
        validate=validate.Length(
            1, MAX_LEAKED_SECRET, error=f"must be 1 to {MAX_LEAKED_SECRET} characters"
        ),
    )
    type = fields.String(
        required=True,
        validate=validate.Length(
            1, MAX_SCANNING_FIELD, error=f"must be 1 to {MAX_SCANNING_FIELD} characters"
        ),
    )
    url = fields.String(
        required=True,
        validate=validate.Length(
            max=MAX_WEBHOOK_URL, error=f"must be at most {MAX_WEBHOOK_URL} characters"
        ),
    )
    source = fields.String(
        required=True,
        validate=validate.Length(
            max=MAX_SCANNING_FIELD, error=f"must be at most {MAX_SCANNING_FIELD} characters"
        ),
    )


class ScanningReportSchema(Schema):
    """GitHub's report, its array held as ``tokens``: 1 to MAX_SCANNING_TOKENS tokens."""

    tokens = BoundedList(
        fields.Nested(ScanningTokenSchema),
        required=True,
        validate=validate.Length(
            1, MAX_SCANNING_TOKENS, error=f"must hold 1 to {MAX_SCANNING_TOKENS} tokens"
        ),
    )


# GitHub's feedback (keysvc.http.views.leaks): GitHub's format, not the envelope, one
# entry per token reported.
SCANNING_FEEDBACK = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "token_hash": {
                "type": "string",
                "pattern": "^[0-9a-f]{64}$",
                "description": "SHA-256 of the token, in hex: never the token itself.",
            },
            "token_type": {"type": "string", "description": "The report's `type`."},
            "label": {"type": "string", "enum": ["true_positive", "false_positive"]},
        },
        "required": ["token_hash", "token_type", "label"],
        "additionalProperties": False,
    },
}


def scanning_operation(operation: dict[str, Any], token: dict[str, str]) -> dict[str, Any]:
    """The secret-scanning operation (``keysvc.http.openapi``): GitHub's signed array in,
    GitHub's feedback out (``SCANNING_FEEDBACK``, the requestId in a header), public.
    ``token`` is the reference to ``ScanningTokenSchema``'s component."""
    # Not "required": with the endpoint off (the default) every request is a 404, headers
    # or not; on, a report without both is refused (403) before anything else.
    for name, what in (
        (IDENTIFIER_HEADER, "The `key_identifier` of the GitHub key that signed the body."),
        (SIGNATURE_HEADER, "Base64 of the DER ECDSA P-256 / SHA-256 signature of the body."),
    ):
        operation["parameters"].append(
            {
                "name": name,
                "in": "header",
                "required": False,
                "description": what + " Without it, the report is refused (403).",
                "schema": {"type": "string"},
            }
        )
    array = {"type": "array", "items": token, "minItems": 1, "maxItems": MAX_SCANNING_TOKENS}
    operation["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": array}},
    }
    operation["security"] = []
    return operation
