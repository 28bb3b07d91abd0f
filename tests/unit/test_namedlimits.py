"""The named rate limits' shared shape (issue 36): wire form, stored form, the key's
limit before its identity's, and the field's rules."""

import pytest
from marshmallow import Schema, ValidationError

from keysvc.domain import namedlimits as nl
from keysvc.http.keyfields import named_limits_field


class _Owner(Schema):
    ratelimits = named_limits_field()


def test_stored_form_round_trips():
    limits = (nl.NamedLimit("tokens", 100_000, 60, False), nl.NamedLimit("rps", 5, 1, True))
    assert nl.loads(nl.dumps(limits)) == limits
    assert nl.loads(None) == () and nl.loads("") == ()


def test_the_keys_limit_of_a_name_comes_before_the_identitys():
    key = (nl.NamedLimit("tokens", 10, 60),)
    identity = (nl.NamedLimit("tokens", 99, 60), nl.NamedLimit("daily", 1000, 86_400, True))
    assert nl.effective(key, identity) == (
        ("key", key[0]),
        ("identity", identity[1]),
    )


def test_the_field_loads_defaults_and_whole_numbers():
    loaded = _Owner().load({"ratelimits": [{"name": "a.b-c_9", "limit": 5.0, "windowSeconds": 60}]})
    assert nl.from_wire(loaded["ratelimits"]) == (nl.NamedLimit("a.b-c_9", 5, 60, False),)


@pytest.mark.parametrize(
    "entries",
    [
        [{"name": "Tokens", "limit": 1, "windowSeconds": 1}],
        [{"name": "tokens per", "limit": 1, "windowSeconds": 1}],
        [{"name": "x" * 65, "limit": 1, "windowSeconds": 1}],
        [{"name": "", "limit": 1, "windowSeconds": 1}],
        [{"name": "a", "limit": True, "windowSeconds": 1}],
        [{"name": "a", "limit": 0, "windowSeconds": 1}],
        [{"name": "a", "limit": 1, "windowSeconds": 86_400 * 31 + 1}],
        [{"name": "a", "limit": 1, "windowSeconds": 1}] * 2,
        [{"name": f"n{i}", "limit": 1, "windowSeconds": 1} for i in range(17)],
    ],
)
def test_the_field_refuses(entries):
    with pytest.raises(ValidationError):
        _Owner().load({"ratelimits": entries})
