"""The rules on changing and rotating keys that need no database (keysvc.domain.keys):
a key may change only keys no stronger than itself, and rotating another key asks
for the power to mint credentials.

The rotation's other refusals (the key disabled or expired, rotated with its previous
credentials) are checked inside ``rotate_key``'s transaction on the key as read there,
not by a function of their own; the API tests cover them (tests/api/test_rotation*.py)."""

import dataclasses
import uuid

import pytest

from keysvc.domain.keys import ROTATE_OTHER, STRONGER_KEY, may_change
from keysvc.domain.permissions import missing
from keysvc.errors import Forbidden
from keysvc.models import Key, Role
from tests.records import ROLE_AT, key


def role(name: str, *permissions: str) -> Role:
    return Role(str(uuid.uuid4()), name, "custom", permissions, ROLE_AT, ROLE_AT)


def holding(*permissions: str, key_id: str = "caller") -> Key:
    return dataclasses.replace(key(), id=key_id, roles=(role("r", *permissions),))


ADMIN = holding("*")
KEY_MANAGER = holding("keys:*")
READER = holding("keys:read", "reports:read")


@pytest.mark.parametrize(
    ("caller", "target"),
    [
        (ADMIN, ADMIN),
        (ADMIN, READER),
        (KEY_MANAGER, holding("keys:read", "keys:update")),
        (READER, holding("reports:read")),
        (READER, holding()),  # a key with no permission at all
        (READER, READER),
    ],
)
def test_a_key_may_change_a_key_no_stronger_than_itself(caller: Key, target: Key) -> None:
    may_change(caller, target)


@pytest.mark.parametrize(
    ("caller", "target"),
    [
        (KEY_MANAGER, ADMIN),
        (KEY_MANAGER, READER),  # reports:read is beyond keys:*
        (READER, KEY_MANAGER),
        (holding("keys:update"), holding("keys:update", "keys:delete")),
    ],
)
def test_a_key_may_not_change_a_stronger_one(caller: Key, target: Key) -> None:
    with pytest.raises(Forbidden) as refused:
        may_change(caller, target)
    assert refused.value.message == STRONGER_KEY  # names no permission


def test_the_refusal_is_about_permissions_not_roles() -> None:
    """The same permissions through other roles, or split over several, are no stronger."""
    target = dataclasses.replace(
        key(), roles=(role("a", "keys:read"), role("bb", "keys:update", "keys:read"))
    )
    may_change(holding("keys:read", "keys:update"), target)


def test_rotating_another_key_asks_for_keys_create() -> None:
    assert ROTATE_OTHER == "keys:create"
    assert missing(KEY_MANAGER.permissions, (ROTATE_OTHER,)) is None
    assert missing(ADMIN.permissions, (ROTATE_OTHER,)) is None
    assert missing(holding("keys:update").permissions, (ROTATE_OTHER,)) == ROTATE_OTHER
