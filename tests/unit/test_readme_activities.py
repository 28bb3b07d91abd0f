"""The activity section (docs/concepts/events.md, moved from the README) names every
kind of record keysvc writes, and says how long records are kept as the settings do."""

from pathlib import Path

from keysvc.domain.activities import ADDED_TYPES, ADDED_UPDATE_TYPES, UPSTREAM_TYPES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "events.md"
HEADING = "## Activities (audit log)"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(HEADING)
    return text[start : text.index("\n## ", start + len(HEADING))]


def test_every_activity_type_is_named() -> None:
    section = _section()
    missing = [t for t in (*UPSTREAM_TYPES, *ADDED_TYPES, *ADDED_UPDATE_TYPES)
               if f"`{t}`" not in section]  # fmt: skip
    assert missing == []


def test_the_retention_setting_is_named_and_no_retention_is_not_claimed() -> None:
    section = " ".join(_section().split())
    assert "--activity-retention-days" in section
    assert "there is no retention" not in section
