"""Prometheus metrics: the families keysvc exports, in a registry of their own.

Each app gets its own ``CollectorRegistry`` (never the process-wide default),
so any number of apps can live in one process, as they do in the tests. Labels
hold only bounded, non-secret values: route templates (never raw paths),
methods, statuses, fixed reasons and states, and store method names. No key
ID, secret, key UUID or organization ever becomes a label.

This module knows nothing of aiohttp; the access middleware, the auth code and
the store feed it through plain method calls.
"""

import bisect
import time
from collections.abc import Iterator, Mapping
from typing import Literal, Protocol, get_args

import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# Why authentication or authorization ended as it did, one per authenticated request:
# ok          the key was accepted (and, where the route or view checked, authorized)
# malformed   no credentials, not Basic, undecodable, or a keysvc_ secret with a bad checksum
# invalid_credentials  no key has this key ID, or the secret is wrong: one value for both,
#             as the caller gets one answer for both, so that no signal tells whether a
#             key ID exists
# rotated     the key ID and secret a rotation replaced, their grace over (the secret
#             is right, so this tells its holder nothing new); not a failed login
# disabled    the secret is right but the key is disabled
# expired     the secret is right but the key has expired
# ip          the client address is outside the key's IP access list
# permission  the key belongs to another organization or lacks the permission
# rate_limited  the address's failed authentications, or the key's requests, are over their limit
AuthReason = Literal[
    "ok",
    "malformed",
    "invalid_credentials",
    "rotated",
    "disabled",
    "expired",
    "ip",
    "permission",
    "rate_limited",
]
AUTH_REASONS: tuple[AuthReason, ...] = get_args(AuthReason)
KEY_STATES = ("enabled", "disabled", "expired")
# How often at most keys are counted by state, however often /metrics is scraped.
KEYS_COUNTED_EVERY_SECONDS = 30
# generate_latest writes the classic text format; every Prometheus version reads 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


# name, help text, label names
Family = tuple[str, str, tuple[str, ...]]
REQUESTS: Family = (
    "keysvc_http_requests",
    "HTTP requests answered, by route template, method and status.",
    ("route", "method", "status"),
)
LATENCY: Family = (
    "keysvc_http_request_duration_seconds",
    "Time from receiving a request to its response, by route template and method.",
    ("route", "method"),
)
AUTH: Family = (
    "keysvc_auth_outcomes",
    "Authentication and authorization outcomes, by reason.",
    ("reason",),
)
# prometheus_client's default histogram buckets, +Inf last.
LATENCY_BUCKETS = Histogram.DEFAULT_BUCKETS
# The le labels, written as prometheus_client writes them ("0.005", "1.0", "+Inf").
_LATENCY_LE = tuple(str(floatToGoString(bound)) for bound in LATENCY_BUCKETS)  # type: ignore[no-untyped-call]


class _Latency:
    """One histogram child: observations per bucket (not cumulative), and their sum."""

    __slots__ = ("buckets", "created", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BUCKETS)
        self.sum = 0.0
        self.created = time.time()


class RequestTallies(Collector):
    """The three families recorded on every request (REQUESTS, LATENCY, AUTH), kept
    as plain numbers and made into metric families only when scraped.

    prometheus_client's Counter and Histogram take a lock for every increment, and
    the histogram walks its buckets in Python: 2.6 us a request by timeit, several
    times that under load. Here a request costs a few dict lookups, a bisect and
    some additions. The exposition is the one those classes give, ``_created``
    included (``tests/api/test_metrics.py`` compares the text). Only one thread may
    record: keysvc's event loop, which also serves the scrape.
    """

    def __init__(self) -> None:
        self._requests: dict[tuple[str, str, int], int] = {}
        self._requests_created: dict[tuple[str, str, int], float] = {}
        self._latency: dict[tuple[str, str], _Latency] = {}
        self._auth = dict.fromkeys(AUTH_REASONS, 0)
        self._auth_created = time.time()

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        labels = (route, method, status)
        count = self._requests.get(labels)
        if count is None:
            self._requests_created[labels] = time.time()
            count = 0
        self._requests[labels] = count + 1
        latency = self._latency.get((route, method))
        if latency is None:
            latency = self._latency[(route, method)] = _Latency()
        latency.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        latency.sum += seconds

    def auth(self, reason: AuthReason) -> None:
        self._auth[reason] += 1

    def collect(self) -> Iterator[Metric]:
        # As prometheus_client's own metrics decide (PROMETHEUS_DISABLE_CREATED_SERIES).
        created = getattr(prometheus_client.metrics, "_use_created", True)
        name, documentation, labels = REQUESTS
        requests = CounterMetricFamily(name, documentation, labels=labels)
        for (route, method, status), count in self._requests.items():
            when = self._requests_created[(route, method, status)] if created else None
            requests.add_metric((route, method, str(status)), count, created=when)
        yield requests
        name, documentation, labels = LATENCY
        latency = HistogramMetricFamily(name, documentation, labels=labels)
        for (route, method), child in self._latency.items():
            total, cumulative = 0, []
            for le, count in zip(_LATENCY_LE, child.buckets, strict=True):
                total += count
                cumulative.append((le, total))
            latency.add_metric((route, method), cumulative, child.sum)
            if created:
                stamp = Sample(name + "_created", {"route": route, "method": method}, child.created)
                latency.samples.append(stamp)
        yield latency
        name, documentation, labels = AUTH
        auth = CounterMetricFamily(name, documentation, labels=labels)
        for reason, count in self._auth.items():
            auth.add_metric((reason,), count, created=self._auth_created if created else None)
        yield auth


class ReadSource(Protocol):
    """A store's reads by target (``keysvc.db.postgres.replicas.RoutedReader``)."""

    def reads(self) -> Mapping[str, int]: ...

    def lags(self) -> Mapping[str, tuple[bool, float]]: ...


class ReadTargets(Collector):
    """Reads by target (the primary, each replica by host:port), and each replica's
    state: whether reads may use it, and its replay lag at its last check."""

    def __init__(self, source: ReadSource):
        self._source = source

    def collect(self) -> Iterator[Metric]:
        reads = CounterMetricFamily(
            "keysvc_db_reads", "Reads outside a write transaction, by target.", labels=("target",)
        )
        for target, count in self._source.reads().items():
            reads.add_metric((target,), count)
        yield reads
        up = GaugeMetricFamily(
            "keysvc_replica_up", "1 while reads may use the replica, 0 while it is left out.",
            labels=("replica",),
        )  # fmt: skip
        lag = GaugeMetricFamily(
            "keysvc_replica_lag_seconds",
            "How far the replica's replay was behind the primary at its last check.",
            labels=("replica",),
        )
        for name, (usable, seconds) in self._source.lags().items():
            up.add_metric((name,), 1 if usable else 0)
            lag.add_metric((name,), seconds)
        yield up
        yield lag


class Metrics:
    """The metric families of one app, and the registry that exports them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Public for the access record, which counts every request straight into it.
        self.tallies = RequestTallies()
        self.registry.register(self.tallies)
        self._keys = Gauge(
            "keysvc_keys",
            "API keys by effective state (expired: enabled but past expireAt),"
            f" counted at most every {KEYS_COUNTED_EVERY_SECONDS} s.",
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
        self._counted = Gauge(
            "keysvc_keys_counted",
            "1 when keysvc_keys is a count made now, 0 when the database did not answer"
            " the last scrape's count (keysvc_keys is then the last count made).",
            registry=self.registry,
        )
        # Every reason (see RequestTallies) and state is exported from the start, at zero,
        # so that rates and alerts need no special case for a series that appears late.
        for state in KEY_STATES:
            self._keys.labels(state=state)
        # The labelled children, looked up once per label set: operations are bounded.
        self._db_by_operation: dict[str, Histogram] = {}

    def observe_db(self, operation: str, seconds: float) -> None:
        child = self._db_by_operation.get(operation)
        if child is None:
            child = self._db_by_operation[operation] = self._db.labels(operation=operation)
        child.observe(seconds)

    def set_keys_by_state(self, counts: Mapping[str, int] | None) -> None:
        """The keys by state as just counted; None: not counted now (the last kept)."""
        self._counted.set(0 if counts is None else 1)
        if counts is None:
            return
        for state in KEY_STATES:
            self._keys.labels(state=state).set(counts.get(state, 0))

    def watch_reads(self, source: ReadSource) -> None:
        """Export the reads by target and the replicas' states (``ReadTargets``)."""
        self.registry.register(ReadTargets(source))

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return generate_latest(self.registry)
