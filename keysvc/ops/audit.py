"""``keysvc audit verify``: check every organization's activity chain with the pepper
the database was made with, and that the keys and custom roles are as their records
leave them, on either backend (``keysvc.db.backends.verify_audit``).

It reads one snapshot, so it may run while keysvc serves. Exit codes: 0 when every
chain holds and matches the tables (one line of summary), 1 naming the first bad
record or mismatched key or role, 2 when it cannot check (no such database, an old
schema, a missing or wrong pepper).
"""

from keysvc.config import Settings
from keysvc.db.activities import Verdict
from keysvc.db.backends import verify_audit


def verify(settings: Settings) -> Verdict:
    """The verdict on the database ``settings`` names; ConfigError when it cannot check."""
    return verify_audit(settings)


def summary(verdict: Verdict) -> str:
    return (
        f"audit log intact: {verdict.records} activities in {verdict.organizations} organizations"
    )
