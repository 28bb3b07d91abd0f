"""The settings' values: each parser takes a setting's text and gives its typed value,
or raises ConfigError saying why it cannot be used (``keysvc.config`` names which
setting). The constants bounding them live here too."""

import grp
import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from keysvc.scanning import ScanningKeys, load_keys

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_BODY_BYTES = 64 * 1024
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOOPS = ("asyncio", "uvloop")
# Which requests get an access line (keysvc.http.access): every one, all but the verify
# successes, or none.
ACCESS_LOGS = ("all", "errors", "off")


# What a leaked key's report does (keysvc.domain.leaks): disable it, or leave it enabled
# and only record the report and send key.leaked.
LEAKED_KEY_ACTIONS = ("disable", "notify")


class ConfigError(ValueError):
    """A setting has a value keysvc cannot use; the message says which and why."""


def db_path(value: str) -> Path:
    if value == ":memory:":
        raise ConfigError("must be a file path; keysvc keeps its keys on disk")
    return Path(value)


def port(value: str) -> int:
    port = _int(value)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{port} is outside 0..65535")
    return port


# ASCII digits, with a minus for the refusals that name a negative number: ``int()``
# alone takes Arabic-Indic digits, "1_000" and surrounding spaces.
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


def _int(value: str) -> int:
    if not _INTEGER.fullmatch(value):
        raise ConfigError(f"{value!r} is not a number")
    return int(value)


def positive(value: str) -> int:
    number = _int(value)
    if number < 1:
        raise ConfigError(f"{number} must be at least 1")
    return number


# Server processes on one port: past this, a machine spends its memory on copies of
# the app rather than on requests.
MAX_WORKERS = 64


def workers(value: str) -> int:
    number = _int(value)
    if not 1 <= number <= MAX_WORKERS:
        raise ConfigError(f"{number} must be from 1 to {MAX_WORKERS}")
    return number


# Ten years: far past any retention asked for, and far from where date arithmetic
# (now minus the retention, at each prune) overflows.
MAX_USAGE_RETENTION_DAYS = 3650


def retention_days(value: str) -> int:
    days = _int(value)
    if not 1 <= days <= MAX_USAGE_RETENTION_DAYS:
        raise ConfigError(f"{days} must be from 1 to {MAX_USAGE_RETENTION_DAYS} days (ten years)")
    return days


def activity_retention(value: str) -> int | None:
    if value.strip().lower() == "off":
        return None
    return retention_days(value)


# An activity page's bounds in bytes: room for the largest record, and far below
# what a client should hold at once.
MIN_PAGE_BYTES, MAX_PAGE_BYTES = 64 * 1024, 64 * 1024 * 1024


def page_bytes(value: str) -> int:
    number = _int(value)
    if not MIN_PAGE_BYTES <= number <= MAX_PAGE_BYTES:
        raise ConfigError(f"{number} must be from {MIN_PAGE_BYTES} to {MAX_PAGE_BYTES} bytes")
    return number


# The longest a proxy may reuse a verify answer: a disabled, deleted or narrowed key
# may pass for this long after the change (docs/SECURITY.md, "Reused verify answers").
MAX_VERIFY_REUSE_SECONDS = 60


def reuse_seconds(value: str) -> int:
    seconds = _int(value)
    if not 0 <= seconds <= MAX_VERIFY_REUSE_SECONDS:
        raise ConfigError(f"{seconds} must be from 0 (no reuse) to {MAX_VERIFY_REUSE_SECONDS} s")
    return seconds


_UNITS = {"s": 1, "m": 60, "h": 3600}


def rate(value: str) -> tuple[int, int] | None:
    if value.lower() in ("", "off"):
        return None
    match = re.fullmatch(r"([0-9]+)/([0-9]*)([smh])", value.strip())
    if not match or int(match[1]) < 1 or match[2] == "0":
        raise ConfigError(f"{value!r} is not a limit such as 100/10s, 1000/m or off")
    return int(match[1]), int(match[2] or 1) * _UNITS[match[3]]


def count(value: str) -> int:
    number = _int(value)
    if number < 0:
        raise ConfigError(f"{number} must not be negative")
    return number


# The longest a webhook may fail before it is disabled: a year, in hours.
MAX_WEBHOOK_DISABLE_HOURS = 8760


def disable_after_hours(value: str) -> int:
    hours = _int(value)
    if not 0 <= hours <= MAX_WEBHOOK_DISABLE_HOURS:
        raise ConfigError(f"{hours} must be from 0 (never) to {MAX_WEBHOOK_DISABLE_HOURS} hours")
    return hours


def seconds(value: str) -> float:
    try:
        if not value.isascii():
            raise ValueError(value)
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds < 86400:
        raise ConfigError(f"{value} must be more than 0 and less than 86400 seconds")
    return seconds


def networks(value: str) -> tuple[IPNetwork, ...]:
    networks = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError:
            raise ConfigError(f"{item!r} is not an IP address or CIDR") from None
    return tuple(networks)


def prefix_of(bits: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        length = _int(value)
        if not 1 <= length <= bits:
            raise ConfigError(f"{length} is not a prefix length from 1 to {bits}")
        return length

    return parse


def log_level(value: str) -> str:
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)}")
    return level


def loop(value: str) -> str:
    name = value.strip().lower()
    if name not in LOOPS:
        raise ConfigError(f"{value!r} is not an event loop; use one of {', '.join(LOOPS)}")
    return name


def access_log(value: str) -> str:
    mode = value.strip().lower()
    if mode not in ACCESS_LOGS:
        raise ConfigError(
            f"{value!r} is not an access log setting; use one of {', '.join(ACCESS_LOGS)}"
        )
    return mode


def leaked_key_action(value: str) -> str:
    action = value.strip().lower()
    if action not in LEAKED_KEY_ACTIONS:
        raise ConfigError(f"{value!r} must be one of {', '.join(LEAKED_KEY_ACTIONS)}")
    return action


def scanning_keys(value: str) -> ScanningKeys | None:
    if not value:
        return None
    try:
        return load_keys(Path(value))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# A deployment's secret prefix: lowercase letters, digits and underscores, starting with
# a letter and ending with an underscore (which base62 lacks, so a scanner's regex tells
# where the prefix ends), 3 to 32 characters; never the webhook secrets' whsec_.
_SECRET_PREFIX = re.compile(r"[a-z][a-z0-9_]{1,30}_")


def postgres_urls(value: str) -> tuple[str, ...]:
    """Comma-separated PostgreSQL URLs (read replicas); empty: none."""
    urls = tuple(part.strip() for part in value.split(",") if part.strip())
    for number, url in enumerate(urls, 1):
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("each must be a postgresql:// URL")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - read for its ValueError: a port that is no number
        except ValueError:
            # Not the URL itself, nor the parser's words: either may hold a password.
            raise ConfigError(
                f"URL {number}: its host or port cannot be read (a port is 1 to 65535;"
                " an IPv6 host is in [brackets])"
            ) from None
    return urls


def postgres_url(value: str) -> str | None:
    """One PostgreSQL URL; empty: none."""
    urls = postgres_urls(value)
    if len(urls) > 1:
        raise ConfigError("must be one postgresql:// URL")
    return urls[0] if urls else None


def secret_prefix(value: str) -> str:
    if not _SECRET_PREFIX.fullmatch(value) or value == "whsec_":
        raise ConfigError(
            f"{value[:40]!r} must be 3 to 32 lowercase letters, digits and underscores,"
            " starting with a letter and ending with _ (not whsec_), such as acme_"
        )
    return value


def switch(value: str) -> bool:
    """1/0 as well as on/off, true/false, yes/no."""
    switch = value.strip().lower()
    if switch in ("1", "on", "true", "yes"):
        return True
    if switch in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{value!r} must be 1 or 0 (on or off)")


def on_off(value: str) -> bool:
    switch = value.strip().lower()
    if switch not in ("on", "off"):
        raise ConfigError(f"{value!r} must be on or off")
    return switch == "on"


# Printable ASCII without spaces, so that it travels in a header unchanged.
_TOKEN = re.compile(r"[!-~]{16,}")


def metrics_token(value: str) -> str | None:
    if not value:
        return None
    if not _TOKEN.fullmatch(value):
        raise ConfigError("must be at least 16 printable ASCII characters, without spaces")
    return value


def unix_path(value: str) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        raise ConfigError(f"{value!r} must be an absolute path, such as /run/keysvc/keysvc.sock")
    return path


def group(value: str) -> int | None:
    """A group name or number, as the gid the unix socket file is given."""
    if not value:
        return None
    if _INTEGER.fullmatch(value) and not value.startswith("-"):
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(f"{value!r} is no group on this machine") from None


def pepper(value: str) -> bytes | None:
    if not value:
        return None
    if len(value.encode()) < 32:
        raise ConfigError("must be at least 32 bytes")
    return value.encode()
