"""Permission strings and the one rule that matches them.

A permission is ``namespace:action`` (the action may hold further colons, as
in ``control-plane:organization:view``). ``namespace:*`` grants every action
of a namespace, and ``*`` grants everything. The management API uses the
``keys`` and ``roles`` namespaces; any other namespace belongs to the
services behind keysvc.
"""

import re
from collections.abc import Iterable

PERMISSION = re.compile(r"\*|[a-z0-9][a-z0-9_.-]*:(\*|[a-z0-9][a-z0-9_.:-]*)")
MAX_PERMISSION_LENGTH = 128


def has_permission(granted: Iterable[str], needed: str) -> bool:
    namespace = needed.partition(":")[0]
    return any(p == "*" or p == needed or p == f"{namespace}:*" for p in granted)


def missing(granted: Iterable[str], wanted: Iterable[str]) -> str | None:
    """The first of ``wanted`` that ``granted`` does not cover, if any."""
    held = frozenset(granted)
    return next((p for p in wanted if not has_permission(held, p)), None)
