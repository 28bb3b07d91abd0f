"""An import's activity holds each key's values encoded where the batch is planned
(``keysvc.domain.imports._view``: issue 37's speed, the keys' JSON made in
``keysvc import``'s planning process), put together as text in the transaction
(``JsonText``). The text must be what encoding the whole value would store."""

import json
from datetime import UTC, datetime

from keysvc.db.activities import json_text
from keysvc.domain import imports
from keysvc.models import JsonText, NewKey, Role

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ROLES = [
    Role("r-1", "developer", "system", ("keys:read",), NOW, NOW),
    Role("r-2", 'caf\u00e9 \u2603 "quoted"', "custom", ("keys:write",), NOW, NOW),
]


def _new(name: str, state: str = "enabled", **fields: object) -> NewKey:
    return NewKey(
        organization_id="org",
        name=name,
        state=state,
        key_id_hash=b"k" * 32,
        secret_hash=b"s" * 32,
        key_suffix="",
        created_at=NOW,
        **fields,  # type: ignore[arg-type]
    )


def test_the_batch_text_is_the_encoding_of_the_whole_value() -> None:
    keys = [
        ("k-1", _new("plain"), ROLES[:1]),
        ("k-2", _new('\u00fcnicode \u2014 "name"\\', state="disabled"), ROLES),
        (
            "k-3",
            _new(
                "limited",
                expire_at=datetime(2027, 1, 2, 3, 4, 5, 600000, tzinfo=UTC),
                ip_access_list=[{"ip": "10.0.0.0/8", "description": "office \u00e9"}],
                rate_limit=(100, 60),
            ),
            ROLES[1:],
        ),
    ]
    views = [imports._view(key_id, new, roles) for key_id, new, roles in keys]
    text = imports._after(views)
    whole = {"count": 3, "keys": [json.loads(view) for view in views]}
    assert isinstance(text, JsonText)
    assert text.text == json_text(whole)
    assert json.loads(text.text)["keys"][1]["assignedRoles"][1]["roleName"] == ROLES[1].name
    assert json.loads(text.text)["keys"][2]["rateLimit"] == {"limit": 100, "windowSeconds": 60}
