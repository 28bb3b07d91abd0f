"""The bodies of imports (issue 37): an import record (a create's fields, its
``importId``, and its material as ``hashData``, a ``tokenHash`` or none), the request
that carries up to a thousand of them, and its answer. ``load_records`` checks each
record on its own, so that a bad one is reported by its index and the others go on;
the CLI's import (``keysvc.cli.porting``) checks its lines with the same schema.

A token hash is the SHA-256 of a bearer token, hex or base64 (standard or URL-safe,
padded or not); it is kept as base64 of the digest, the form ``hashData`` carries.
"""

import base64
import binascii
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, ValidationError, fields, post_load, validate, validates_schema

from keysvc.domain.imports import MAX_IMPORT_RECORDS
from keysvc.errors import BadRequest
from keysvc.http.schemas import ADDITION, MAX_NAME, CreateKeySchema, load

MAX_IMPORT_ID = 255
# Whole: ``validate.Regexp`` matches at the start only (rt60 F6: "ok" then a NUL and
# a newline was taken).
_IMPORT_ID = re.compile(r"[\x21-\x7e]+\Z")
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
TOKEN_HASH_DOC = {
    **ADDITION,
    "description": "keysvc addition: the SHA-256 of the key's bearer token, which then "
    "authenticates as `Authorization: Bearer <token>`. Give this, hashData, or neither "
    "(an exported record: the key opens with nothing until it is rotated).",
}
IMPORT_ID_DOC = {
    **ADDITION,
    "description": "Your own ID for this record (printable ASCII, no spaces, at most "
    f"{MAX_IMPORT_ID} characters): a record whose importId this organization imported "
    "before is skipped, so importing the same records again makes nothing twice.",
}


def _digest(encoding: str, value: str) -> bytes | None:
    """The 32 bytes ``value`` encodes, or None."""
    if encoding == "hex":
        return bytes.fromhex(value) if _HEX_DIGEST.fullmatch(value) else None
    text = value.strip().replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 32 else None


class TokenHashSchema(Schema):
    algorithm = fields.String(
        required=True, validate=validate.OneOf(["sha256"], error="must be sha256")
    )
    encoding = fields.String(
        required=True, validate=validate.OneOf(["hex", "base64"], error="must be hex or base64")
    )
    value = fields.String(required=True, validate=validate.Length(max=100))

    @validates_schema
    def _thirty_two_bytes(self, data: dict[str, Any], **kwargs: Any) -> None:
        if _digest(data.get("encoding", ""), data.get("value", "")) is None:
            raise ValidationError(
                "must be a SHA-256 digest: 64 hex digits, or 32 bytes in base64", "value"
            )

    @post_load
    def _as_base64(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        digest = _digest(data["encoding"], data["value"])
        assert digest is not None
        return {"algorithm": "sha256", "value": base64.b64encode(digest).decode()}


class ImportRecordSchema(CreateKeySchema):
    """One record: a create's fields, ``importId``, and at most one material."""

    importId = fields.String(
        required=True,
        validate=[
            validate.Length(min=1, max=MAX_IMPORT_ID, error="must be 1 to {max} characters"),
            validate.Regexp(_IMPORT_ID, error="must be printable ASCII without spaces"),
        ],
        metadata=IMPORT_ID_DOC,
    )
    tokenHash = fields.Nested(TokenHashSchema, metadata=TOKEN_HASH_DOC)

    @validates_schema
    def _one_material(self, data: dict[str, Any], **kwargs: Any) -> None:
        if "hashData" in data and "tokenHash" in data:
            raise ValidationError("give hashData or tokenHash, not both", "tokenHash")


class ImportKeysSchema(Schema):
    """The import request: its records, each checked on its own (``load_records``)."""

    keys = fields.List(
        # Any JSON value: each is checked on its own (a record is an object), and a bad
        # one, null included, is reported by its index while the rest go in.
        fields.Raw(allow_none=True),
        required=True,
        validate=validate.Length(
            min=1, max=MAX_IMPORT_RECORDS, error="must hold 1 to {max} records"
        ),
        metadata={"description": "The records: each an ImportRecord."},
    )


class ImportedKeySchema(Schema):
    index = fields.Integer(metadata={"description": "The record's place in keys, from 0."})
    importId = fields.String()
    id = fields.String(metadata={"description": "The new key's UUID."})


class ImportErrorSchema(Schema):
    index = fields.Integer(metadata={"description": "The record's place in keys, from 0."})
    importId = fields.String(allow_none=True)
    error = fields.String(metadata={"description": "Why the record was not imported."})


class ImportResultSchema(Schema):
    imported = fields.Integer(metadata={"description": "Keys made by this request."})
    skipped = fields.Integer(
        metadata={"description": "Records whose importId was imported before: nothing made."}
    )
    keys = fields.List(fields.Nested(ImportedKeySchema))
    errors = fields.List(fields.Nested(ImportErrorSchema))


# Built once (building deep-copies the fields); ``now`` is set before each load, which
# is synchronous.
_RECORD = ImportRecordSchema(now=datetime.fromtimestamp(0, UTC))
# A record's own values, which differ from record to record: each is checked on its
# own (``_own_values``); the rest of a record (its roles, state, limits,
# meta...) is loaded whole once per distinct remainder and kept (``_REMAINDERS``).
_OWN = ("importId", "name", "externalId")
_MATERIAL = ("tokenHash", "hashData")
_REMAINDERS: dict[str, dict[str, Any]] = {}
REMAINDERS_KEPT = 1024
_TOKEN_FIELDS = {"algorithm", "encoding", "value"}
_SET_APART_ORDER = _OWN + _MATERIAL
_SET_APART = frozenset(_SET_APART_ORDER)


def _remainder(record: dict[str, Any]) -> str | None:
    """What ``record`` is checked by beside its own values, as a key of _REMAINDERS;
    None for a record that is always loaded whole: one with an expireAt (checked against
    the clock), or a material that is not an object."""
    if "expireAt" in record:
        return None
    token = record.get("tokenHash")
    if token is not None and not isinstance(token, dict):
        return None
    shape = None if token is None else (token.get("algorithm"), token.get("encoding"))
    rest = [(k, v) for k, v in record.items() if k not in _SET_APART]
    present = [k for k in _SET_APART_ORDER if k in record]
    # repr tells 1, 1.0 and true apart, as the load does; equal records written in
    # another order (or with objects in another order) are two keys, each loaded whole
    # once.
    return repr((rest, present, shape))


def _plain_name(value: object) -> str | None:
    """``value`` as the Name field loads it, when it is plain: a string that is printable
    ASCII once trimmed, 1 to MAX_NAME characters, which Name takes as it is (no control
    or invisible character is ASCII and printable); None for anything else, which the
    field itself then checks. No field object is called: a million records' names."""
    if type(value) is not str:
        return None
    text = value.strip()
    if 0 < len(text) <= MAX_NAME and text.isascii() and text.isprintable():
        return text
    return None


def _plain_import_id(value: object) -> str | None:
    """``value`` as importId's field loads it, when it is 1 to MAX_IMPORT_ID printable
    ASCII characters without a space (what the field's pattern asks of each of them);
    None for anything else, which the field itself then checks."""
    if (
        type(value) is str
        and 0 < len(value) <= MAX_IMPORT_ID
        and value.isascii()
        and value.isprintable()
        and " " not in value
    ):
        return value
    return None


_PLAIN = {"importId": _plain_import_id, "name": _plain_name, "externalId": _plain_name}


def _own_values(record: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any] | None:
    """``record`` loaded: ``kept`` (its remainder's load) with its own values, each
    checked by hand when plain (``_PLAIN``) or else by the schema's field; None when
    one is refused (the whole load then says why, in its words)."""
    out = dict(kept)
    fields_ = _RECORD.fields
    try:
        for name in _OWN:
            if name in record:
                value = record[name]
                plain = _PLAIN[name](value)
                if plain is not None:
                    out[name] = plain
                else:
                    out[name] = fields_[name].deserialize(value)
        token = record.get("tokenHash")
        if token is not None:
            if len(token) != len(_TOKEN_FIELDS) or not _TOKEN_FIELDS.issuperset(token):
                return None
            value = token["value"]
            if type(value) is not str or len(value) > 100 or token["algorithm"] != "sha256":
                return None
            digest = _digest(token["encoding"], value)
            if digest is None:
                return None
            out["tokenHash"] = {"algorithm": "sha256", "value": base64.b64encode(digest).decode()}
        if "hashData" in record:
            out["hashData"] = fields_["hashData"].deserialize(record["hashData"])
    except ValidationError:
        return None
    return out


def _load_one(record: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``record`` as ``load`` loads it with the record schema (BadRequest if refused),
    most records through ``_own_values`` (tests/unit/test_import_records.py holds the
    two equal)."""
    remainder = _remainder(record)
    kept = None if remainder is None else _REMAINDERS.get(remainder)
    if kept is not None:
        loaded = _own_values(record, kept)
        if loaded is not None:
            return loaded
    _RECORD.now = now
    loaded = load(_RECORD, record)
    if remainder is not None:
        if len(_REMAINDERS) >= REMAINDERS_KEPT:
            _REMAINDERS.clear()
        _REMAINDERS[remainder] = {k: v for k, v in loaded.items() if k not in _OWN + _MATERIAL}
    return loaded


def load_records(
    records: Iterable[tuple[int, Any]], now: datetime
) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str | None, str]]]:
    """Each (index, record) checked as a create's body is, at ``now``: the valid ones as
    (index, record), the others as (index, its importId if it has one, the reason). A
    record may be an exception: the reason it could not be read (the CLI's bad JSON)."""
    valid: list[tuple[int, dict[str, Any]]] = []
    refused: list[tuple[int, str | None, str]] = []
    for index, record in records:
        if isinstance(record, Exception):
            refused.append((index, None, str(record)))
            continue
        if not isinstance(record, dict):
            refused.append((index, None, "must be a JSON object"))
            continue
        try:
            valid.append((index, _load_one(record, now)))
        except BadRequest as exc:
            import_id = record.get("importId")
            refused.append((index, import_id if isinstance(import_id, str) else None, exc.message))
    return valid, refused
