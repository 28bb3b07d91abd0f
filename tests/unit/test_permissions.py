"""The permission rule with no database and no server (keysvc.domain.permissions):
which grants cover a permission (itself, its namespace's ``ns:*``, ``*``), the first
permission a set of grants lacks, and why a key may not grant a role."""

import pytest

from keysvc.domain.permissions import PERMISSION, cannot_grant, has_permission, missing


@pytest.mark.parametrize(
    ("granted", "needed"),
    [
        ({"keys:read"}, "keys:read"),
        ({"*"}, "keys:delete"),
        ({"keys:*"}, "keys:create"),
        ({"control-plane:*"}, "control-plane:organization:view"),
        ({"control-plane:organization:view"}, "control-plane:organization:view"),
        (["keys:read", "roles:read"], "roles:read"),  # any iterable, not only sets
    ],
)
def test_a_permission_is_held_by_itself_its_namespace_or_everything(
    granted: set[str], needed: str
) -> None:
    assert has_permission(granted, needed)


@pytest.mark.parametrize(
    ("granted", "needed"),
    [
        (set(), "keys:read"),
        ({"keys:read"}, "keys:create"),
        ({"roles:*"}, "keys:read"),
        ({"keys:read:*"}, "keys:read"),  # no wildcard below the namespace
        ({"control-plane:organization:*"}, "control-plane:organization:view"),
        ({"key:*"}, "keys:read"),  # a namespace is matched whole, not by its prefix
        ({"keys"}, "keys:read"),
    ],
)
def test_nothing_else_holds_a_permission(granted: set[str], needed: str) -> None:
    assert not has_permission(granted, needed)


def test_missing_names_the_first_permission_not_covered() -> None:
    wanted = ["keys:read", "roles:write", "webhooks:write"]
    assert missing({"keys:*"}, wanted) == "roles:write"
    assert missing({"keys:*", "roles:write"}, wanted) == "webhooks:write"
    assert missing({"keys:*", "roles:*", "webhooks:write"}, wanted) is None
    assert missing({"*"}, wanted) is None
    assert missing(set(), []) is None


def test_a_role_is_grantable_only_by_a_key_holding_all_its_permissions() -> None:
    assert cannot_grant({"*"}, "ops", ["reports:read", "keys:delete"]) is None
    assert cannot_grant({"reports:*"}, "ops", ["reports:read", "reports:write"]) is None
    assert cannot_grant({"keys:read"}, "ops", []) is None
    assert cannot_grant({"reports:read"}, "ops", ["reports:read", "keys:delete"]) == (
        "cannot grant role ops: this key lacks the permission keys:delete"
    )


@pytest.mark.parametrize(
    "text", ["*", "keys:read", "keys:*", "control-plane:organization:view", "a1_b.c-d:x-y"]
)
def test_well_formed_permissions(text: str) -> None:
    assert PERMISSION.fullmatch(text)


@pytest.mark.parametrize("text", ["", "keys", "Keys:read", "keys:", ":read", "*:read", "keys:*x"])
def test_malformed_permissions(text: str) -> None:
    assert PERMISSION.fullmatch(text) is None
