"""The domain's bounds (keysvc.domain.limits) are the ones the request schemas check."""

from keysvc.domain import limits
from keysvc.http.schemas import PatchKeySchema


def test_the_key_fields_are_the_patch_bodys_fields_in_order() -> None:
    assert tuple(PatchKeySchema._declared_fields) == limits.KEY_FIELDS


def test_a_key_may_change_only_its_own_name() -> None:
    assert "name" not in limits.OWN_ACCESS
    assert set(limits.OWN_ACCESS) | {"name"} == set(PatchKeySchema._declared_fields)
