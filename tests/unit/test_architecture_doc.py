"""docs/ARCHITECTURE.md names modules and functions; each must exist in the tree."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")

# A path such as keysvc/db/core.py or keysvc/http/, and a dotted name such as
# keysvc.db.core.StoreCore.start_upkeep (a trailing full stop ends a sentence).
PATHS = sorted(set(re.findall(r"\bkeysvc/[\w/.]*\w/?", DOC)))
NAMES = sorted(set(re.findall(r"\bkeysvc(?:\.\w+)+", DOC)))
# The contract's calls and the caches' named short: `Store.get_key`, `Caches.data_version`.
SHORT = {"Store": "keysvc.db.contract.Store", "Caches": "keysvc.db.cache.Caches"}
CALLS = sorted(set(re.findall(r"`(Store|Caches)\.(\w+)`", DOC)))


def resolve(dotted: str) -> object:
    """The object a dotted name names: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_the_doc_names_modules_and_names() -> None:
    assert len(PATHS) > 10 and len(NAMES) > 30 and len(CALLS) > 10


@pytest.mark.parametrize("path", PATHS)
def test_each_path_the_doc_names_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"docs/ARCHITECTURE.md names {path}, which is not in the tree"


@pytest.mark.parametrize("name", NAMES)
def test_each_dotted_name_the_doc_names_exists(name: str) -> None:
    resolve(name)


@pytest.mark.parametrize(("owner", "call"), CALLS)
def test_each_store_call_the_doc_names_exists(owner: str, call: str) -> None:
    assert hasattr(resolve(SHORT[owner]), call), f"{owner}.{call} is not in {SHORT[owner]}"
