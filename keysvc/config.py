"""Settings: one frozen dataclass, built from flags, then KEYSVC_* environment
variables, then defaults. ``OPTIONS`` is the single table of settings: the CLI
builds its flags and help from it. Bad values stop start-up with a one-line
reason."""

import grp
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class Settings:
    db_path: Path = Path("var/keysvc.db")
    # A PostgreSQL database's URL, given as --db or KEYSVC_DB: it then stands in for
    # db_path, which is not used (keysvc.db.backends).
    db_url: str | None = field(default=None, repr=False)
    host: str = "127.0.0.1"
    port: int = 8080
    max_keys_per_org: int = 1000
    # (limit, window seconds) applied to keys without their own rateLimit; None: off.
    rate_limit: tuple[int, int] | None = None
    auth_failures: int = 20
    cache_size: int = 10_000
    workers: int = 1
    trusted_proxies: tuple[IPNetwork, ...] = ()
    # From KEYSVC_PEPPER; when None the pepper lives in a 0600 file beside the database.
    pepper: bytes | None = field(default=None, repr=False)
    max_body_bytes: int = MAX_BODY_BYTES
    log_level: str = "info"
    metrics: bool = True
    # Failed logins are counted per address prefix of these lengths (keysvc.domain.ratelimit).
    throttle_prefix_v4: int = 32
    throttle_prefix_v6: int = 64
    # The bearer token /metrics requires; None: /metrics answers anyone who reaches it.
    metrics_token: str | None = field(default=None, repr=False)
    # A unix socket to serve on besides (or, with tcp off, instead of) host:port.
    unix_path: Path | None = None
    unix_group: int | None = None
    tcp: bool = True
    max_roles_per_org: int = 1000
    # The connection layer of `keysvc serve` (keysvc.http.connections).
    header_timeout: float = 10.0
    idle_timeout: float = 75.0
    max_connections: int = 1000
    # The event loop `keysvc serve` runs on (keysvc.cli): one of LOOPS.
    loop: str = "uvloop"
    # Which answers get an access line: one of ACCESS_LOGS.
    access_log: str = "errors"
    # Usage counts (keysvc.db.usage): kept this many days, written this often.
    usage_retention_days: int = 30
    usage_flush_seconds: float = 10.0
    # Webhook delivery (keysvc.ops.delivery) and the targets it may reach (keysvc.domain.targets).
    webhook_allow_private: bool = False
    webhook_retry_seconds: float = 30.0
    webhook_timeout: float = 10.0
    webhook_concurrency: int = 8
    webhook_org_concurrency: int = 2
    webhook_expiry_scan: float = 300.0
    # Hours a webhook may fail every attempt before it is disabled (0: never).
    webhook_disable_after_hours: int = 120
    # On PostgreSQL: request limits and failed logins counted with every instance on
    # the database (keysvc.domain.sharedlimits). Nothing to share on SQLite.
    shared_limits: bool = True
    # What one organization may make the database hold (keysvc.db.quota): MiB of
    # activities and webhook deliveries an hour (0: off), and deliveries waiting per
    # webhook (0: off).
    org_write_budget_mib: int = 32
    webhook_queue_limit: int = 1000
    # Days activities are kept (None: for ever), pruned in the background
    # (keysvc.db.retention); and the most bytes of records one activity page holds.
    activity_retention_days: int | None = None
    activity_page_bytes: int = 1024 * 1024
    # What a report of a key's leaked secret does to the key (keysvc.domain.leaks): one
    # of LEAKED_KEY_ACTIONS.
    leaked_key_action: str = "disable"
    # GitHub secret scanning's public keys (keysvc.scanning), read at start from the
    # file KEYSVC_GITHUB_SCANNING_KEYS names; None: its endpoint is off (404).
    github_scanning_keys: ScanningKeys | None = None
    # What the secrets this deployment issues start with (keysvc.credentials); secrets
    # issued under another prefix before keep working (they are checked by hash).
    secret_prefix: str = "keysvc_"  # noqa: S105 - a public marker for scanners
    # Seconds a proxy may reuse a /v1/verify answer (keysvc.domain.reuse); 0: none.
    verify_reuse_seconds: int = 1

    @property
    def pepper_path(self) -> Path:
        return pepper_path_of(self.db_path)


def pepper_path_of(db_path: Path) -> Path:
    """Where the pepper file of the database (or backup) at ``db_path`` lives."""
    return db_path.with_name(db_path.name + ".pepper")


def is_postgres_url(value: str) -> bool:
    """Whether a --db value names a PostgreSQL database rather than a SQLite file."""
    return value.startswith(("postgresql://", "postgres://"))


def _db_path(value: str) -> Path:
    if value == ":memory:":
        raise ConfigError("must be a file path; keysvc keeps its keys on disk")
    return Path(value)


def _port(value: str) -> int:
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


def _positive(value: str) -> int:
    number = _int(value)
    if number < 1:
        raise ConfigError(f"{number} must be at least 1")
    return number


# Server processes on one port: past this, a machine spends its memory on copies of
# the app rather than on requests.
MAX_WORKERS = 64


def _workers(value: str) -> int:
    number = _int(value)
    if not 1 <= number <= MAX_WORKERS:
        raise ConfigError(f"{number} must be from 1 to {MAX_WORKERS}")
    return number


# Ten years: far past any retention asked for, and far from where date arithmetic
# (now minus the retention, at each prune) overflows.
MAX_USAGE_RETENTION_DAYS = 3650


def _retention_days(value: str) -> int:
    days = _int(value)
    if not 1 <= days <= MAX_USAGE_RETENTION_DAYS:
        raise ConfigError(f"{days} must be from 1 to {MAX_USAGE_RETENTION_DAYS} days (ten years)")
    return days


def _activity_retention(value: str) -> int | None:
    if value.strip().lower() == "off":
        return None
    return _retention_days(value)


# An activity page's bounds in bytes: room for the largest record, and far below
# what a client should hold at once.
MIN_PAGE_BYTES, MAX_PAGE_BYTES = 64 * 1024, 64 * 1024 * 1024


def _page_bytes(value: str) -> int:
    number = _int(value)
    if not MIN_PAGE_BYTES <= number <= MAX_PAGE_BYTES:
        raise ConfigError(f"{number} must be from {MIN_PAGE_BYTES} to {MAX_PAGE_BYTES} bytes")
    return number


# The longest a proxy may reuse a verify answer: a disabled, deleted or narrowed key
# may pass for this long after the change (docs/SECURITY.md, "Reused verify answers").
MAX_VERIFY_REUSE_SECONDS = 60


def _reuse_seconds(value: str) -> int:
    seconds = _int(value)
    if not 0 <= seconds <= MAX_VERIFY_REUSE_SECONDS:
        raise ConfigError(f"{seconds} must be from 0 (no reuse) to {MAX_VERIFY_REUSE_SECONDS} s")
    return seconds


_UNITS = {"s": 1, "m": 60, "h": 3600}


def _rate(value: str) -> tuple[int, int] | None:
    if value.lower() in ("", "off"):
        return None
    match = re.fullmatch(r"([0-9]+)/([0-9]*)([smh])", value.strip())
    if not match or int(match[1]) < 1 or match[2] == "0":
        raise ConfigError(f"{value!r} is not a limit such as 100/10s, 1000/m or off")
    return int(match[1]), int(match[2] or 1) * _UNITS[match[3]]


def _count(value: str) -> int:
    number = _int(value)
    if number < 0:
        raise ConfigError(f"{number} must not be negative")
    return number


# The longest a webhook may fail before it is disabled: a year, in hours.
MAX_WEBHOOK_DISABLE_HOURS = 8760


def _disable_after_hours(value: str) -> int:
    hours = _int(value)
    if not 0 <= hours <= MAX_WEBHOOK_DISABLE_HOURS:
        raise ConfigError(f"{hours} must be from 0 (never) to {MAX_WEBHOOK_DISABLE_HOURS} hours")
    return hours


def _seconds(value: str) -> float:
    try:
        if not value.isascii():
            raise ValueError(value)
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds < 86400:
        raise ConfigError(f"{value} must be more than 0 and less than 86400 seconds")
    return seconds


def _networks(value: str) -> tuple[IPNetwork, ...]:
    networks = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError:
            raise ConfigError(f"{item!r} is not an IP address or CIDR") from None
    return tuple(networks)


def _prefix_of(bits: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        length = _int(value)
        if not 1 <= length <= bits:
            raise ConfigError(f"{length} is not a prefix length from 1 to {bits}")
        return length

    return parse


def _log_level(value: str) -> str:
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)}")
    return level


def _loop(value: str) -> str:
    name = value.strip().lower()
    if name not in LOOPS:
        raise ConfigError(f"{value!r} is not an event loop; use one of {', '.join(LOOPS)}")
    return name


def _access_log(value: str) -> str:
    mode = value.strip().lower()
    if mode not in ACCESS_LOGS:
        raise ConfigError(
            f"{value!r} is not an access log setting; use one of {', '.join(ACCESS_LOGS)}"
        )
    return mode


def _leaked_key_action(value: str) -> str:
    action = value.strip().lower()
    if action not in LEAKED_KEY_ACTIONS:
        raise ConfigError(f"{value!r} must be one of {', '.join(LEAKED_KEY_ACTIONS)}")
    return action


def _scanning_keys(value: str) -> ScanningKeys | None:
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


def _secret_prefix(value: str) -> str:
    if not _SECRET_PREFIX.fullmatch(value) or value == "whsec_":
        raise ConfigError(
            f"{value[:40]!r} must be 3 to 32 lowercase letters, digits and underscores,"
            " starting with a letter and ending with _ (not whsec_), such as acme_"
        )
    return value


def _switch(value: str) -> bool:
    """1/0 as well as on/off, true/false, yes/no."""
    switch = value.strip().lower()
    if switch in ("1", "on", "true", "yes"):
        return True
    if switch in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{value!r} must be 1 or 0 (on or off)")


def _on_off(value: str) -> bool:
    switch = value.strip().lower()
    if switch not in ("on", "off"):
        raise ConfigError(f"{value!r} must be on or off")
    return switch == "on"


# Printable ASCII without spaces, so that it travels in a header unchanged.
_TOKEN = re.compile(r"[!-~]{16,}")


def _metrics_token(value: str) -> str | None:
    if not value:
        return None
    if not _TOKEN.fullmatch(value):
        raise ConfigError("must be at least 16 printable ASCII characters, without spaces")
    return value


def _unix_path(value: str) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        raise ConfigError(f"{value!r} must be an absolute path, such as /run/keysvc/keysvc.sock")
    return path


def _group(value: str) -> int | None:
    """A group name or number, as the gid the unix socket file is given."""
    if not value:
        return None
    if _INTEGER.fullmatch(value) and not value.startswith("-"):
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(f"{value!r} is no group on this machine") from None


def _pepper(value: str) -> bytes | None:
    if not value:
        return None
    if len(value.encode()) < 32:
        raise ConfigError("must be at least 32 bytes")
    return value.encode()


@dataclass(frozen=True)
class Option:
    field: str
    env: str
    default: str
    parse: Callable[[str], Any]
    help: str
    flag: bool = True

    @property
    def flag_name(self) -> str:
        return "--" + self.field.removesuffix("_path").replace("_", "-")


OPTIONS = (
    Option(
        "db_path", "KEYSVC_DB", "var/keysvc.db", _db_path,
        "SQLite database file, or a PostgreSQL URL (postgresql://user@host/dbname)",
    ),
    Option("host", "KEYSVC_HOST", "127.0.0.1", str, "address to bind"),
    Option("port", "KEYSVC_PORT", "8080", _port, "port to bind"),
    Option(
        "max_keys_per_org", "KEYSVC_MAX_KEYS_PER_ORG", "1000", _positive,
        "most keys one organization may hold",
    ),
    Option(
        "trusted_proxies", "KEYSVC_TRUSTED_PROXIES", "", _networks,
        "comma-separated CIDRs of proxies whose X-Forwarded-For is believed",
    ),
    Option(
        "rate_limit", "KEYSVC_RATE_LIMIT", "off", _rate,
        "requests per key per window for keys without their own rateLimit, e.g. 100/10s",
    ),
    Option(
        "auth_failures", "KEYSVC_AUTH_FAILURES", "20", _positive,
        "failed authentications per client network (--throttle-prefix-v4/v6) a minute before 429",
    ),
    Option(
        "cache_size", "KEYSVC_CACHE_SIZE", "10000", _count,
        "credentials kept in memory per process (0: no cache)",
    ),
    Option(
        "workers", "KEYSVC_WORKERS", "1", _workers,
        f"server processes sharing the port, 1 to {MAX_WORKERS}",
    ),
    Option(
        "log_level", "KEYSVC_LOG_LEVEL", "info", _log_level,
        f"least severe log records written, one of {', '.join(LOG_LEVELS)}",
    ),
    Option(
        "metrics", "KEYSVC_METRICS", "on", _on_off,
        "serve Prometheus metrics at /metrics: on or off",
    ),
    Option(
        "pepper", "KEYSVC_PEPPER", "", _pepper,
        "secret key of the stored hashes, at least 32 bytes (default: a 0600 file <db>.pepper)",
        flag=False,
    ),
    Option(
        "throttle_prefix_v4", "KEYSVC_THROTTLE_PREFIX_V4", "32", _prefix_of(32),
        "failed authentications are counted per IPv4 network of this prefix length",
    ),
    Option(
        "throttle_prefix_v6", "KEYSVC_THROTTLE_PREFIX_V6", "64", _prefix_of(128),
        "failed authentications are counted per IPv6 network of this prefix length",
    ),
    Option(
        "metrics_token", "KEYSVC_METRICS_TOKEN", "", _metrics_token,
        "token /metrics requires as Authorization: Bearer <token>, at least 16 characters"
        " (default: none, /metrics answers anyone who reaches the port)",
    ),
    Option(
        "unix_path", "KEYSVC_UNIX", "", _unix_path,
        "unix socket to serve on, mode 0660, for a proxy on this machine; its"
        " X-Forwarded-For is believed",
    ),
    Option(
        "unix_group", "KEYSVC_UNIX_GROUP", "", _group,
        "group (name or number) of the unix socket file: the proxy's, so that only it"
        " can connect (default: keysvc's own)",
    ),
    Option(
        "tcp", "KEYSVC_TCP", "on", _on_off,
        "serve on host:port too: on, or off to serve on the unix socket alone",
    ),
    Option(
        "max_roles_per_org", "KEYSVC_MAX_ROLES_PER_ORG", "1000", _positive,
        "most custom roles one organization may hold",
    ),
    Option(
        "header_timeout", "KEYSVC_HEADER_TIMEOUT", "10", _seconds,
        "seconds a client may take to send a request line and headers, and a body, before"
        " it is cut off",
    ),
    Option(
        "idle_timeout", "KEYSVC_IDLE_TIMEOUT", "75", _seconds,
        "seconds a kept-alive connection may wait for its next request",
    ),
    Option(
        "max_connections", "KEYSVC_MAX_CONNECTIONS", "1000", _positive,
        "connections open at once per process; more are closed at once",
    ),
    Option(
        "loop", "KEYSVC_LOOP", "uvloop", _loop,
        f"event loop to serve on, one of {', '.join(LOOPS)}",
    ),
    Option(
        "access_log", "KEYSVC_ACCESS_LOG", "errors", _access_log,
        "access lines written: all; errors, every one but a verify's success; or off",
    ),
    Option(
        "usage_retention_days", "KEYSVC_USAGE_RETENTION_DAYS", "30", _retention_days,
        "days the per-minute usage counts of keys, and deleted keys' tombstones, are kept,"
        f" 1 to {MAX_USAGE_RETENTION_DAYS}",
    ),
    Option(
        "usage_flush_seconds", "KEYSVC_USAGE_FLUSH_SECONDS", "10", _seconds,
        "seconds between writes of each process's usage counts: what a crash may lose",
    ),
    Option(
        "webhook_allow_private", "KEYSVC_WEBHOOK_ALLOW_PRIVATE", "0", _switch,
        "1: webhooks may target loopback, private and other non-public addresses"
        " (default 0: refused at create and at delivery)",
    ),
    Option(
        "webhook_retry_seconds", "KEYSVC_WEBHOOK_RETRY_SECONDS", "30", _seconds,
        "seconds before a failed webhook delivery is tried again, doubled with each"
        " failure (at most an hour), for a day",
    ),
    Option(
        "webhook_timeout", "KEYSVC_WEBHOOK_TIMEOUT", "10", _seconds,
        "seconds one webhook delivery attempt may take",
    ),
    Option(
        "webhook_concurrency", "KEYSVC_WEBHOOK_CONCURRENCY", "8", _positive,
        "webhook delivery attempts under way at once, per process",
    ),
    Option(
        "webhook_org_concurrency", "KEYSVC_WEBHOOK_ORG_CONCURRENCY", "2", _positive,
        "one organization's webhook delivery attempts under way at once, across all"
        " processes (keep it below KEYSVC_WEBHOOK_CONCURRENCY)",
    ),
    Option(
        "webhook_expiry_scan", "KEYSVC_WEBHOOK_EXPIRY_SCAN", "300", _seconds,
        "seconds between scans for keys a key.expiring webhook should warn of",
    ),
    Option(
        "webhook_disable_after_hours", "KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS", "120",
        _disable_after_hours,
        "hours a webhook may fail every delivery attempt before it is disabled (and its"
        " organization's webhook.disabled sent); 0: never",
    ),
    Option(
        "shared_limits", "KEYSVC_SHARED_LIMITS", "on", _on_off,
        "on a PostgreSQL database, count request limits and failed logins with every"
        " instance on it: on, or off for each process to count its own (SQLite: unused)",
    ),
    Option(
        "org_write_budget_mib", "KEYSVC_ORG_WRITE_BUDGET_MIB", "32", _count,
        "MiB of activity records and webhook deliveries one organization may write an"
        " hour; past it its writes get 429 until the hour ends (0: no budget)",
    ),
    Option(
        "webhook_queue_limit", "KEYSVC_WEBHOOK_QUEUE_LIMIT", "1000", _count,
        "deliveries that may wait per webhook; past it writes that would send it an event"
        " get 429 (0: no limit)",
    ),
    Option(
        "activity_retention_days", "KEYSVC_ACTIVITY_RETENTION_DAYS", "off",
        _activity_retention,
        f"days activity records are kept, 1 to {MAX_USAGE_RETENTION_DAYS}, older ones pruned"
        " from each chain's start; or off (default) to keep every record",
    ),
    Option(
        "activity_page_bytes", "KEYSVC_ACTIVITY_PAGE_BYTES", str(1024 * 1024), _page_bytes,
        "bytes of records an activity page holds at most before it ends with a nextCursor,"
        f" {MIN_PAGE_BYTES} to {MAX_PAGE_BYTES}",
    ),
    Option(
        "leaked_key_action", "KEYSVC_LEAKED_KEY_ACTION", "disable", _leaked_key_action,
        "what a report of a key's leaked secret does: disable the key (default), or notify"
        " (record it and send key.leaked, the key left enabled)",
    ),
    Option(
        "secret_prefix", "KEYSVC_SECRET_PREFIX", "keysvc_", _secret_prefix,
        "what the secrets this deployment issues start with, so that scanners tell its"
        " secrets from another deployment's; secrets issued before keep working",
    ),
    Option(
        "github_scanning_keys", "KEYSVC_GITHUB_SCANNING_KEYS", "", _scanning_keys,
        "file of GitHub secret scanning's public keys (the JSON GitHub publishes), read at"
        " start: turns POST /v1/secret-scanning/github on (default: off, 404)",
    ),
    Option(
        "verify_reuse_seconds", "KEYSVC_VERIFY_REUSE_SECONDS", "1", _reuse_seconds,
        "seconds a proxy may reuse a /v1/verify answer (X-Accel-Expires, Cache-Control),"
        f" 0 to {MAX_VERIFY_REUSE_SECONDS}; 0: every request reaches keysvc",
    ),
)  # fmt: skip


def build_settings(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Flags (by field name) win over the environment, which wins over defaults."""
    flags = flags or {}
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = flags.get(option.field)
        if raw is None or raw == "":
            raw = env.get(option.env) or option.default
        if option.field == "db_path" and is_postgres_url(str(raw)):
            values["db_url"] = str(raw)  # db_path keeps its default, unused
            continue
        try:
            values[option.field] = option.parse(str(raw))
        except ConfigError as exc:
            name = option.flag_name.lstrip("-") if option.flag else option.env
            raise ConfigError(f"{name}: {exc}") from None
    return Settings(**values)
