"""Sample records for the renderer tests: keys and roles in every shape the answers
take (quotes and non-ASCII in names, each optional field set and unset)."""

import dataclasses
from datetime import UTC, datetime
from typing import Any

from keysvc.models import Key, Role

ROLE_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SYSTEM = Role("0b5d3c8e-0000-4000-8000-000000000001", "developer", "system", ("keys:read",),
              ROLE_AT, ROLE_AT)  # fmt: skip
CUSTOM = Role("0b5d3c8e-0000-4000-8000-000000000002", "ops \u00e9\u2603", "custom",
              ("reports:read",), ROLE_AT, ROLE_AT)  # fmt: skip


def key(**changes: Any) -> Key:
    base = Key(
        id="7d7c1b0e-3f43-4c1e-9d0b-4c7e2c1f0a11",
        seq=7,
        organization_id="6a0f6f35-2f7c-4a57-a0e5-5f7b4f3f0c22",
        name='name with "quotes", \\ and \u00fc',
        state="enabled",
        key_suffix="x9Z2",
        created_at=datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC),
        expire_at=None,
        used_at=None,
        ip_access_list=[],
        roles=(SYSTEM,),
    )
    return dataclasses.replace(base, **changes)


KEYS = [
    key(),
    key(used_at=datetime(2026, 5, 6, 7, 9, tzinfo=UTC)),
    key(expire_at=datetime(2030, 1, 1, 0, 0, 0, 123456, tzinfo=UTC), state="disabled"),
    key(roles=(SYSTEM, CUSTOM)),
    key(roles=(CUSTOM,)),
    key(roles=()),
    key(ip_access_list=[{"source": "10.0.0.0/8"}, {"source": "::1/128", "description": "me"}]),
    key(rate_limit=(100, 60)),
    key(
        used_at=datetime(2026, 5, 6, 7, 9, tzinfo=UTC),
        expire_at=datetime(2031, 2, 3, 4, 5, 6, tzinfo=UTC),
        ip_access_list=[{"source": "192.0.2.1/32", "description": ""}],
        roles=(CUSTOM, SYSTEM),
        rate_limit=(1, 86_400),
    ),
]
