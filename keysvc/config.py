"""Settings: one frozen dataclass, built from flags, then KEYSVC_* environment
variables, then defaults. ``OPTIONS`` is the single table of settings: the CLI
builds its flags and help from it. Bad values stop start-up with a one-line
reason."""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keysvc import settingvalues as v
from keysvc.scanning import ScanningKeys
from keysvc.settingvalues import (
    LOG_LEVELS,
    MAX_PAGE_BYTES,
    MAX_USAGE_RETENTION_DAYS,
    MAX_VERIFY_REUSE_SECONDS,
    MIN_PAGE_BYTES,
)
from keysvc.settingvalues import (
    LOOPS as LOOPS,
)
from keysvc.settingvalues import (
    MAX_BODY_BYTES as MAX_BODY_BYTES,
)
from keysvc.settingvalues import (
    MAX_WORKERS as MAX_WORKERS,
)
from keysvc.settingvalues import (
    ConfigError as ConfigError,
)
from keysvc.settingvalues import (
    IPNetwork as IPNetwork,
)


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
    max_connections_per_address: int = 100
    # The event loop `keysvc serve` runs on (keysvc.cli): one of LOOPS.
    loop: str = "uvloop"
    # Which answers get an access line: one of ACCESS_LOGS.
    access_log: str = "errors"
    # Usage counts (keysvc.db.usage): kept this many days, written this often.
    usage_retention_days: int = 30
    usage_flush_seconds: float = 10.0
    # Webhook delivery (keysvc.ops.delivery) and the targets it may reach (keysvc.domain.targets).
    webhook_allow_private: bool = False
    # Whether POST .../keys/import takes token hashes (keysvc.http.views.imports): off,
    # a tenant could learn from it whether another organization holds a token.
    api_token_import: bool = False
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
    # On PostgreSQL: hot standbys of the primary that may answer reads
    # (keysvc.db.postgres.replicas), the replay lag past which one is left out, and a
    # direct URL for the listening connection when --db goes through a pooler.
    pg_replicas: tuple[str, ...] = field(default=(), repr=False)
    pg_replica_max_lag: float = 5.0
    pg_listen_url: str | None = field(default=None, repr=False)

    @property
    def pepper_path(self) -> Path:
        return pepper_path_of(self.db_path)


def pepper_path_of(db_path: Path) -> Path:
    """Where the pepper file of the database (or backup) at ``db_path`` lives."""
    return db_path.with_name(db_path.name + ".pepper")


def is_postgres_url(value: str) -> bool:
    """Whether a --db value names a PostgreSQL database rather than a SQLite file."""
    return value.startswith(("postgresql://", "postgres://"))


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
        "db_path", "KEYSVC_DB", "var/keysvc.db", v.db_path,
        "SQLite database file, or a PostgreSQL URL (postgresql://user@host/dbname)",
    ),
    Option("host", "KEYSVC_HOST", "127.0.0.1", str, "address to bind"),
    Option("port", "KEYSVC_PORT", "8080", v.port, "port to bind"),
    Option(
        "max_keys_per_org", "KEYSVC_MAX_KEYS_PER_ORG", "1000", v.positive,
        "most keys one organization may hold",
    ),
    Option(
        "trusted_proxies", "KEYSVC_TRUSTED_PROXIES", "", v.networks,
        "comma-separated CIDRs of proxies whose X-Forwarded-For is believed",
    ),
    Option(
        "rate_limit", "KEYSVC_RATE_LIMIT", "off", v.rate,
        "requests per key per window for keys without their own rateLimit, e.g. 100/10s",
    ),
    Option(
        "auth_failures", "KEYSVC_AUTH_FAILURES", "20", v.positive,
        "failed authentications per client network (--throttle-prefix-v4/v6) a minute before 429",
    ),
    Option(
        "cache_size", "KEYSVC_CACHE_SIZE", "10000", v.count,
        "credentials kept in memory per process (0: no cache)",
    ),
    Option(
        "workers", "KEYSVC_WORKERS", "1", v.workers,
        f"server processes sharing the port, 1 to {MAX_WORKERS}",
    ),
    Option(
        "log_level", "KEYSVC_LOG_LEVEL", "info", v.log_level,
        f"least severe log records written, one of {', '.join(LOG_LEVELS)}",
    ),
    Option(
        "metrics", "KEYSVC_METRICS", "on", v.on_off,
        "serve Prometheus metrics at /metrics: on or off",
    ),
    Option(
        "pepper", "KEYSVC_PEPPER", "", v.pepper,
        "secret key of the stored hashes, at least 32 bytes (default: a 0600 file <db>.pepper)",
        flag=False,
    ),
    Option(
        "throttle_prefix_v4", "KEYSVC_THROTTLE_PREFIX_V4", "32", v.prefix_of(32),
        "failed authentications are counted per IPv4 network of this prefix length",
    ),
    Option(
        "throttle_prefix_v6", "KEYSVC_THROTTLE_PREFIX_V6", "64", v.prefix_of(128),
        "failed authentications are counted per IPv6 network of this prefix length",
    ),
    Option(
        "metrics_token", "KEYSVC_METRICS_TOKEN", "", v.metrics_token,
        "token /metrics requires as Authorization: Bearer <token>, at least 16 characters"
        " (default: none, /metrics answers anyone who reaches the port)",
    ),
    Option(
        "unix_path", "KEYSVC_UNIX", "", v.unix_path,
        "unix socket to serve on, mode 0660, for a proxy on this machine; its"
        " X-Forwarded-For is believed",
    ),
    Option(
        "unix_group", "KEYSVC_UNIX_GROUP", "", v.group,
        "group (name or number) of the unix socket file: the proxy's, so that only it"
        " can connect (default: keysvc's own)",
    ),
    Option(
        "tcp", "KEYSVC_TCP", "on", v.on_off,
        "serve on host:port too: on, or off to serve on the unix socket alone",
    ),
    Option(
        "max_roles_per_org", "KEYSVC_MAX_ROLES_PER_ORG", "1000", v.positive,
        "most custom roles one organization may hold",
    ),
    Option(
        "header_timeout", "KEYSVC_HEADER_TIMEOUT", "10", v.seconds,
        "seconds a client may take to send a request line and headers, and a body, or to"
        " read an answer, before it is cut off",
    ),
    Option(
        "idle_timeout", "KEYSVC_IDLE_TIMEOUT", "75", v.seconds,
        "seconds a kept-alive connection may wait for its next request",
    ),
    Option(
        "max_connections", "KEYSVC_MAX_CONNECTIONS", "1000", v.positive,
        "connections open at once per process; more are closed at once",
    ),
    Option(
        "max_connections_per_address", "KEYSVC_MAX_CONNECTIONS_PER_ADDRESS", "100", v.positive,
        "TCP connections one client address (an IPv6 /64) holds per process whatever the"
        " others do (unless TCP is full), past which it shares a pool of half of TCP's"
        " slots; a trusted proxy's excepted; more are closed at once",
    ),
    Option(
        "loop", "KEYSVC_LOOP", "uvloop", v.loop,
        f"event loop to serve on, one of {', '.join(LOOPS)}",
    ),
    Option(
        "access_log", "KEYSVC_ACCESS_LOG", "errors", v.access_log,
        "access lines written: all; errors, every one but a verify's success; or off",
    ),
    Option(
        "usage_retention_days", "KEYSVC_USAGE_RETENTION_DAYS", "30", v.retention_days,
        "days the per-minute usage counts of keys, and deleted keys' tombstones, are kept,"
        f" 1 to {MAX_USAGE_RETENTION_DAYS}",
    ),
    Option(
        "usage_flush_seconds", "KEYSVC_USAGE_FLUSH_SECONDS", "10", v.seconds,
        "seconds between writes of each process's usage counts: what a crash may lose",
    ),
    Option(
        "webhook_allow_private", "KEYSVC_WEBHOOK_ALLOW_PRIVATE", "0", v.switch,
        "1: webhooks may target loopback, private and other non-public addresses"
        " (default 0: refused at create and at delivery)",
    ),
    Option(
        "api_token_import", "KEYSVC_API_TOKEN_IMPORT", "0", v.switch,
        "1: POST .../keys/import takes tokenHash records (default 0: only keysvc import"
        " does; an import answers whether a token is taken, in any organization)",
    ),
    Option(
        "webhook_retry_seconds", "KEYSVC_WEBHOOK_RETRY_SECONDS", "30", v.seconds,
        "seconds before a failed webhook delivery is tried again, doubled with each"
        " failure (at most an hour), for a day",
    ),
    Option(
        "webhook_timeout", "KEYSVC_WEBHOOK_TIMEOUT", "10", v.seconds,
        "seconds one webhook delivery attempt may take",
    ),
    Option(
        "webhook_concurrency", "KEYSVC_WEBHOOK_CONCURRENCY", "8", v.positive,
        "webhook delivery attempts under way at once, per process",
    ),
    Option(
        "webhook_org_concurrency", "KEYSVC_WEBHOOK_ORG_CONCURRENCY", "2", v.positive,
        "one organization's webhook delivery attempts under way at once, across all"
        " processes (keep it below KEYSVC_WEBHOOK_CONCURRENCY)",
    ),
    Option(
        "webhook_expiry_scan", "KEYSVC_WEBHOOK_EXPIRY_SCAN", "300", v.seconds,
        "seconds between scans for keys a key.expiring webhook should warn of",
    ),
    Option(
        "webhook_disable_after_hours", "KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS", "120",
        v.disable_after_hours,
        "hours a webhook may fail every delivery attempt before it is disabled (and its"
        " organization's webhook.disabled sent); 0: never",
    ),
    Option(
        "shared_limits", "KEYSVC_SHARED_LIMITS", "on", v.on_off,
        "on a PostgreSQL database, count request limits and failed logins with every"
        " instance on it: on, or off for each process to count its own (SQLite: unused)",
    ),
    Option(
        "org_write_budget_mib", "KEYSVC_ORG_WRITE_BUDGET_MIB", "32", v.count,
        "MiB of activity records and webhook deliveries one organization may write an"
        " hour; past it its writes get 429 until the hour ends (0: no budget)",
    ),
    Option(
        "webhook_queue_limit", "KEYSVC_WEBHOOK_QUEUE_LIMIT", "1000", v.count,
        "deliveries that may wait per webhook; past it writes that would send it an event"
        " get 429 (0: no limit)",
    ),
    Option(
        "activity_retention_days", "KEYSVC_ACTIVITY_RETENTION_DAYS", "off",
        v.activity_retention,
        f"days activity records are kept, 1 to {MAX_USAGE_RETENTION_DAYS}, older ones pruned"
        " from each chain's start; or off (default) to keep every record",
    ),
    Option(
        "activity_page_bytes", "KEYSVC_ACTIVITY_PAGE_BYTES", str(1024 * 1024), v.page_bytes,
        "bytes of records an activity page holds at most before it ends with a nextCursor,"
        f" {MIN_PAGE_BYTES} to {MAX_PAGE_BYTES}",
    ),
    Option(
        "leaked_key_action", "KEYSVC_LEAKED_KEY_ACTION", "disable", v.leaked_key_action,
        "what a report of a key's leaked secret does: disable the key (default), or notify"
        " (record it and send key.leaked, the key left enabled)",
    ),
    Option(
        "secret_prefix", "KEYSVC_SECRET_PREFIX", "keysvc_", v.secret_prefix,
        "what the secrets this deployment issues start with, so that scanners tell its"
        " secrets from another deployment's; secrets issued before keep working",
    ),
    Option(
        "github_scanning_keys", "KEYSVC_GITHUB_SCANNING_KEYS", "", v.scanning_keys,
        "file of GitHub secret scanning's public keys (the JSON GitHub publishes), read at"
        " start: turns POST /v1/secret-scanning/github on (default: off, 404)",
    ),
    Option(
        "verify_reuse_seconds", "KEYSVC_VERIFY_REUSE_SECONDS", "1", v.reuse_seconds,
        "seconds a proxy may reuse a /v1/verify answer (X-Accel-Expires, Cache-Control),"
        f" 0 to {MAX_VERIFY_REUSE_SECONDS}; 0: every request reaches keysvc",
    ),
    Option(
        "pg_replicas", "KEYSVC_PG_REPLICAS", "", v.postgres_urls,
        "comma-separated URLs of hot standbys streaming from the PostgreSQL primary --db"
        " names: reads go there once they have replayed past every change this instance"
        " knows of (default: none)",
    ),
    Option(
        "pg_replica_max_lag", "KEYSVC_PG_REPLICA_MAX_LAG", "5", v.seconds,
        "seconds of replay lag past which a replica is left out until it catches up",
    ),
    Option(
        "pg_listen_url", "KEYSVC_PG_LISTEN_URL", "", v.postgres_url,
        "a direct URL of the primary for the listening connection (LISTEN needs a"
        " session), when --db goes through a pooler in transaction mode (default: --db)",
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
