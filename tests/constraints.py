""".ci/constraints.txt read: each pinned distribution's version, and whether an installed
version is the pinned one (tests/unit/test_constraints.py, tests/system/test_dist.py)."""

import re
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / ".ci" / "constraints.txt"


def pins() -> dict[str, str]:
    """Canonical distribution name -> pinned version, from the file's ``name==version`` lines."""
    pinned: dict[str, str] = {}
    for line in PINS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"not a name==version pin: {line!r}"
        name = canonicalize_name(match[1])
        assert name not in pinned, f"{name} is pinned twice"
        pinned[name] = match[2]
    return pinned


def same_version(installed: str | None, pinned: str) -> bool:
    """Whether ``installed`` is ``pinned``, as versions (pip freeze writes them normalised)."""
    return installed is not None and Version(installed) == Version(pinned)
