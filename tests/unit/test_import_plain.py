"""The import's hand checks of a record's own values (``_plain_name``,
``_plain_import_id``: issue 37's speed, no field object called per record) take what
the schema's fields take, as the fields load it, and leave everything else to the
fields, so that a refusal is always in the fields' own words."""

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from keysvc.errors import BadRequest
from keysvc.http import import_schemas
from keysvc.http.import_schemas import ImportRecordSchema, load_records
from keysvc.http.schemas import load

NOW = datetime(2026, 11, 28, tzinfo=UTC)
TOKEN = {"algorithm": "sha256", "encoding": "hex", "value": hashlib.sha256(b"t").hexdigest()}
BASE: dict[str, Any] = {
    "importId": "a-1",
    "name": "one",
    "roles": ["developer"],
    "tokenHash": TOKEN,
}

NAMES: list[Any] = [
    "plain",
    " padded\t",
    "\u00a0nbsp-padded\u00a0",
    "x" * 255,
    "x" * 256,
    "  " + "x" * 255 + "  ",
    "",
    "   ",
    "tab\tinside",
    "bell\x07",
    "del\x7f",
    "caf\u00e9",
    "a\u202eb",
    "zero\u200bwidth",
    "soft\u00adhyphen",
    "\U000e0001tag",
    None,
    5,
    True,
    ["list"],
]
IMPORT_IDS: list[Any] = [
    "a",
    "x" * 255,
    "x" * 256,
    "",
    "has space",
    " lead",
    "tab\tid",
    "del\x7f",
    "caf\u00e9",
    "~!@#$%^&*()_+{}|:<>?",
    None,
    7,
    7.5,
]


def _whole(record: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "ok", load(ImportRecordSchema(now=NOW), record)
    except BadRequest as exc:
        return "refused", exc.message


def _checked(record: dict[str, Any]) -> tuple[str, Any]:
    import_schemas._REMAINDERS.clear()
    load_records([(0, BASE)], NOW)  # BASE's remainder loaded whole and kept
    valid, refused = load_records([(0, record)], NOW)
    if valid:
        return "ok", valid[0][1]
    return "refused", refused[0][2]


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_a_name_or_external_id_is_taken_as_its_field_takes_it(name: Any) -> None:
    for record in ({**BASE, "name": name}, {**BASE, "externalId": name}):
        assert _checked(record) == _whole(record)


@pytest.mark.parametrize("import_id", IMPORT_IDS, ids=repr)
def test_an_import_id_is_taken_as_its_field_takes_it(import_id: Any) -> None:
    record = {**BASE, "importId": import_id}
    assert _checked(record) == _whole(record)


@pytest.mark.parametrize("value", [" plain ", "x" * 255], ids=repr)
def test_a_plain_value_is_checked_by_hand(value: str) -> None:
    assert import_schemas._plain_name(value) == value.strip()
    assert import_schemas._plain_import_id(value.strip()) == value.strip()


@pytest.mark.parametrize("value", ["caf\u00e9", "tab\tin", "", "x" * 256, 5, None], ids=repr)
def test_anything_else_is_left_to_the_field(value: Any) -> None:
    assert import_schemas._plain_name(value) is None
    assert import_schemas._plain_import_id(value) is None
