"""--db and KEYSVC_DB: a postgresql:// URL selects PostgreSQL (Settings.db_url); a
file path keeps SQLite, the default, unchanged."""

from pathlib import Path

import pytest

from keysvc.config import build_settings

URL = "postgresql://keysvc@127.0.0.1:5432/keysvc"


@pytest.mark.parametrize("url", [URL, "postgres://keysvc@db.internal/keys"])
def test_a_url_flag_selects_postgresql(url: str) -> None:
    settings = build_settings({"db_path": url}, env={})
    assert settings.db_url == url
    assert url not in repr(settings)  # it may carry a password


def test_the_environment_selects_postgresql_too() -> None:
    assert build_settings({}, env={"KEYSVC_DB": URL}).db_url == URL


def test_a_file_keeps_sqlite() -> None:
    settings = build_settings({"db_path": "var/other.db"}, env={"KEYSVC_DB": URL})
    assert (settings.db_url, settings.db_path) == (None, Path("var/other.db"))
    assert build_settings({}, env={}).db_url is None
