"""--db and KEYSVC_DB: a postgresql:// URL selects PostgreSQL (Settings.db_url); a
file path keeps SQLite, the default, unchanged."""

from pathlib import Path

import pytest

from keysvc.config import ConfigError, build_settings

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


@pytest.mark.parametrize(
    "replica",
    [
        "postgresql://keysvc:s3cret@db.internal:port/keys",  # not a number
        "postgresql://keysvc:s3cret@db.internal:99999/keys",  # past 65535
        "postgresql://keysvc:s3cret@[::1/keys",  # a broken IPv6 host
    ],
)
def test_a_replica_url_that_cannot_be_read_is_a_settings_error(replica: str) -> None:
    """Refused as every bad setting is (keysvc: pg-replicas: ..., exit 2), never a bare
    ValueError at start; and the message does not echo the URL, which may hold a
    password."""
    with pytest.raises(ConfigError) as refused:
        build_settings({"db_path": URL, "pg_replicas": replica}, env={})
    assert "s3cret" not in str(refused.value)
