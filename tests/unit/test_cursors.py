"""List cursors with no database and no server: a cursor reads back as the place it
was made for, and only in the list it was made for (keysvc.domain.cursors, and the
key and role lists' own in keysvc.domain.keys and keysvc.domain.roles)."""

import dataclasses

import pytest

from keysvc.credentials import Hasher
from keysvc.domain import cursors, keys, roles
from keysvc.errors import BadRequest
from keysvc.models import Role, RoleDetail
from tests.records import CUSTOM, SYSTEM, key

HASHER = Hasher(bytes(range(32)))
OTHER_PEPPER = Hasher(bytes(32))
ORG = "6a0f6f35-2f7c-4a57-a0e5-5f7b4f3f0c22"
OTHER_ORG = "7b1f7f46-3f8d-4b68-b1f6-6f8c5f4f1d33"


@pytest.mark.parametrize("place", [0, 1, 7, 10**17])
def test_a_cursor_reads_back_as_its_place(place: int) -> None:
    made = cursors.encode(HASHER, "purpose", ORG, place)
    assert cursors.decode(HASHER, "purpose", ORG, made) == place


def test_no_cursor_is_the_start() -> None:
    assert cursors.decode(HASHER, "purpose", ORG, None) == 0
    assert keys.decode_cursor(HASHER, ORG, None) == 0
    assert roles.decode_cursor(HASHER, ORG, None) == roles.START


def bad(cursor: str, hasher: Hasher = HASHER, purpose: str = "purpose", scope: str = ORG) -> str:
    with pytest.raises(BadRequest) as refused:
        cursors.decode(hasher, purpose, scope, cursor)
    return refused.value.message


def test_a_cursor_is_refused_anywhere_else() -> None:
    made = cursors.encode(HASHER, "purpose", ORG, 42)
    assert bad(made, scope=OTHER_ORG) == cursors.BAD_CURSOR  # another organization's list
    assert bad(made, purpose="another list") == cursors.BAD_CURSOR
    assert bad(made, hasher=OTHER_PEPPER) == cursors.BAD_CURSOR  # another server's


@pytest.mark.parametrize(
    "forged",
    [
        "",
        ".",
        "42",
        "43.{mac}",
        "-1.{mac}",
        "4x.{mac}",
        "\u0664\u0662.{mac}",
        "42.",
        "1" * 19 + ".x",
    ],
)
def test_a_forged_cursor_is_refused(forged: str) -> None:
    mac = cursors.encode(HASHER, "purpose", ORG, 42).partition(".")[2]
    assert bad(forged.format(mac=mac)) == cursors.BAD_CURSOR


def test_the_key_list_cursor_stands_after_a_key() -> None:
    listed = dataclasses.replace(key(), org_seq=12)
    made = keys.encode_cursor(HASHER, ORG, listed)
    assert keys.decode_cursor(HASHER, ORG, made) == 12
    with pytest.raises(BadRequest):
        keys.decode_cursor(HASHER, OTHER_ORG, made)


@pytest.mark.parametrize(("role", "kind"), [(SYSTEM, 0), (CUSTOM, 1)])
def test_the_role_list_cursor_stands_after_a_role(role: Role, kind: int) -> None:
    """System roles (0) come before custom ones (1), each kind by name."""
    made = roles.encode_cursor(HASHER, ORG, RoleDetail(role, ORG, ()))
    assert roles.decode_cursor(HASHER, ORG, made) == (kind, role.name)
    with pytest.raises(BadRequest) as refused:
        roles.decode_cursor(HASHER, OTHER_ORG, made)
    assert refused.value.message == roles.BAD_CURSOR
    text, _, mac = made.partition(".")
    with pytest.raises(BadRequest):
        roles.decode_cursor(HASHER, ORG, f"{text}A.{mac}")
