"""Settings: one frozen dataclass, built from flags, then KEYSVC_* environment
variables, then defaults. Bad values stop start-up with a one-line reason."""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DB = "var/keysvc.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
MAX_BODY_BYTES = 64 * 1024


class ConfigError(ValueError):
    """A setting has a value keysvc cannot use; the message says which and why."""


@dataclass(frozen=True)
class Settings:
    db_path: Path = Path(DEFAULT_DB)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # From KEYSVC_PEPPER; when None the pepper lives in a 0600 file beside the database.
    pepper: bytes | None = field(default=None, repr=False)
    max_body_bytes: int = MAX_BODY_BYTES

    @property
    def pepper_path(self) -> Path:
        return self.db_path.with_name(self.db_path.name + ".pepper")


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise ConfigError(f"port: {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"port: {port} is outside 0..65535")
    return port


def _pepper(value: str) -> bytes:
    raw = value.encode()
    if len(raw) < 32:
        raise ConfigError("KEYSVC_PEPPER: must be at least 32 bytes")
    return raw


def build_settings(
    *,
    db: str | None = None,
    host: str | None = None,
    port: str | int | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Flags (the keyword arguments) win over the environment, which wins over defaults."""
    env = os.environ if env is None else env
    db_value = db or env.get("KEYSVC_DB") or DEFAULT_DB
    host_value = host or env.get("KEYSVC_HOST") or DEFAULT_HOST
    port_value = port if port is not None else env.get("KEYSVC_PORT")
    pepper = env.get("KEYSVC_PEPPER")
    if db_value == ":memory:":
        raise ConfigError("db: must be a file path; keysvc keeps its keys on disk")
    return Settings(
        db_path=Path(db_value),
        host=host_value,
        port=DEFAULT_PORT if port_value in (None, "") else _port(str(port_value)),
        pepper=_pepper(pepper) if pepper else None,
    )
