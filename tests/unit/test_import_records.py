"""An import record checked field by field (``keysvc.http.import_schemas._own_values``,
for records whose remainder was loaded before) gives what a whole load of the record
schema gives: the same record, or the same refusal in the same words."""

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from keysvc.errors import BadRequest
from keysvc.http import import_schemas
from keysvc.http.import_schemas import ImportRecordSchema, load_records
from keysvc.http.schemas import load

NOW = datetime(2026, 11, 28, tzinfo=UTC)
DIGEST = hashlib.sha256(b"token").hexdigest()
TOKEN = {"algorithm": "sha256", "encoding": "hex", "value": DIGEST}
BASE: dict[str, Any] = {"importId": "a-1", "name": "one", "roles": ["developer"]}
HASH_DATA = {
    "keyIdHash": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
    "keyIdSuffix": "abcd",
    "keySecretHash": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
}

# Records that share BASE's remainder: only their own values differ.
VARIANTS = [
    {**BASE, "tokenHash": TOKEN},
    {**BASE, "name": "  padded  ", "tokenHash": TOKEN},
    {**BASE, "name": "", "tokenHash": TOKEN},
    {**BASE, "name": "a\u202eb", "tokenHash": TOKEN},
    {**BASE, "name": 5, "tokenHash": TOKEN},
    {**BASE, "importId": "has space", "tokenHash": TOKEN},
    {**BASE, "importId": "x" * 256, "tokenHash": TOKEN},
    {**BASE, "importId": 7, "tokenHash": TOKEN},
    {**BASE, "externalId": "user-1", "tokenHash": TOKEN},
    {**BASE, "externalId": None, "tokenHash": TOKEN},
    {**BASE, "externalId": "", "tokenHash": TOKEN},
    {**BASE, "tokenHash": {**TOKEN, "encoding": "base64", "value": "AAAA"}},
    {**BASE, "tokenHash": {**TOKEN, "value": DIGEST.upper()}},
    {**BASE, "tokenHash": {**TOKEN, "algorithm": "md5"}},
    {**BASE, "tokenHash": {**TOKEN, "extra": 1}},
    {**BASE, "tokenHash": {**TOKEN, "value": 12}},
    {**BASE, "tokenHash": "not an object"},
    {**BASE, "hashData": HASH_DATA},
    {**BASE, "hashData": {**HASH_DATA, "keyIdSuffix": ""}},
    {**BASE, "hashData": HASH_DATA, "tokenHash": TOKEN},
    {**BASE},
    {"name": "no id", "roles": ["developer"], "tokenHash": TOKEN},
]


def _whole(record: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", load(ImportRecordSchema(now=NOW), record)
    except BadRequest as exc:
        return "refused", exc.message


@pytest.mark.parametrize("record", VARIANTS, ids=range(len(VARIANTS)))
def test_a_record_checked_field_by_field_is_loaded_as_a_whole(record: dict[str, Any]) -> None:
    import_schemas._REMAINDERS.clear()
    # The first of its remainder is loaded whole and kept; the record itself then goes
    # through the field-by-field path.
    load_records([(0, {**BASE, "tokenHash": TOKEN}), (1, {**BASE, "hashData": HASH_DATA})], NOW)
    valid, refused = load_records([(0, record)], NOW)
    kind, expected = _whole(record)
    if kind == "ok":
        assert valid == [(0, expected)]
    else:
        assert [reason for _, _, reason in refused] == [expected]
