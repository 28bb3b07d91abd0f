"""Prometheus metrics: the families keysvc exports, in a registry of their own.

Each app gets its own ``CollectorRegistry`` (never the process-wide default),
so any number of apps can live in one process, as they do in the tests. Labels
hold only bounded, non-secret values: route templates (never raw paths),
methods, statuses, fixed reasons and states, and store method names. No key
ID, secret, key UUID or organization ever becomes a label.

This module knows nothing of aiohttp; the access middleware, the auth code and
the store feed it through plain method calls.
"""

from collections.abc import Mapping
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Why authentication or authorization ended as it did, one per authenticated request:
# ok          the key was accepted (and, where the view checked, authorized)
# malformed   no credentials, not Basic, undecodable, or a keysvc_ secret with a bad checksum
# unknown     no key has this key ID
# bad_secret  the key exists but the secret is wrong
# disabled    the secret is right but the key is disabled
# expired     the secret is right but the key has expired
# ip          the client address is outside the key's IP access list
# permission  the key belongs to another organization or lacks the permission
# rate_limited  reserved for rate limiting, which does not exist yet: always 0
AuthReason = Literal[
    "ok",
    "malformed",
    "unknown",
    "bad_secret",
    "disabled",
    "expired",
    "ip",
    "permission",
    "rate_limited",
]
AUTH_REASONS: tuple[AuthReason, ...] = get_args(AuthReason)
KEY_STATES = ("enabled", "disabled", "expired")
# generate_latest writes the classic text format; every Prometheus version reads 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The metric families of one app, and the registry that exports them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "keysvc_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "keysvc_http_request_duration_seconds",
            "Time from receiving a request to its response, by route template and method.",
            ["route", "method"],
            registry=self.registry,
        )
        self._auth = Counter(
            "keysvc_auth_outcomes",
            "Authentication and authorization outcomes, by reason (rate_limited is reserved).",
            ["reason"],
            registry=self.registry,
        )
        self._keys = Gauge(
            "keysvc_keys",
            "API keys by effective state (expired: enabled but past expireAt), read at scrape.",
            ["state"],
            registry=self.registry,
        )
        self._db = Histogram(
            "keysvc_db_call_duration_seconds",
            "Time spent in store calls, by store operation.",
            ["operation"],
            buckets=_DB_BUCKETS,
            registry=self.registry,
        )
        # Every reason and state is exported from the start, at zero, so that
        # rates and alerts need no special case for a series that appears late.
        self._auth_by_reason = {reason: self._auth.labels(reason=reason) for reason in AUTH_REASONS}
        for state in KEY_STATES:
            self._keys.labels(state=state)
        # The labelled children, looked up once per label set rather than on every
        # request: every label value is bounded (see above), and so are these.
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._db_by_operation: dict[str, Histogram] = {}

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        children = self._request_children.get((route, method, status))
        if children is None:
            children = (
                self._requests.labels(route=route, method=method, status=str(status)),
                self._latency.labels(route=route, method=method),
            )
            self._request_children[(route, method, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_auth(self, reason: AuthReason) -> None:
        self._auth_by_reason[reason].inc()

    def observe_db(self, operation: str, seconds: float) -> None:
        child = self._db_by_operation.get(operation)
        if child is None:
            child = self._db_by_operation[operation] = self._db.labels(operation=operation)
        child.observe(seconds)

    def set_keys_by_state(self, counts: Mapping[str, int]) -> None:
        for state in KEY_STATES:
            self._keys.labels(state=state).set(counts.get(state, 0))

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)
