"""Typed keys for what the application and each request carry."""

from collections.abc import Mapping
from datetime import datetime

from aiohttp import web

from keysvc.config import Settings
from keysvc.credentials import Hasher
from keysvc.db.contract import KeyCounts, Store
from keysvc.domain.imports import ImportTurns
from keysvc.domain.leaks import PendingReports
from keysvc.domain.ratelimit import Decision, Limits
from keysvc.logs import Throttled
from keysvc.metrics import AuthReason, Metrics
from keysvc.models import Key
from keysvc.timeutil import Clock

SETTINGS = web.AppKey("settings", Settings)
STORE: web.AppKey[Store] = web.AppKey("store")
HASHER = web.AppKey("hasher", Hasher)
CLOCK: web.AppKey[Clock] = web.AppKey("clock")
# Present only when metrics are on (KEYSVC_METRICS).
METRICS = web.AppKey("metrics", Metrics)
# Present only when metrics are on: the counts behind the keys-by-state gauge.
KEY_STATES: web.AppKey[KeyCounts] = web.AppKey("key_states")
LIMITS = web.AppKey("limits", Limits)
# The task that acts on revoke-by-secret reports written before their answer
# (keysvc.domain.leaks.PendingReports).
LEAK_REPORTS = web.AppKey("leak_reports", PendingReports)
# Each organization's imports, one at a time (keysvc.domain.imports.ImportTurns).
IMPORT_TURNS = web.AppKey("import_turns", ImportTurns)
# The log of requests aiohttp's parser refuses (keysvc.http.middleware).
PARSER_ERROR_LOG = web.AppKey("parser_error_log", Throttled)


class InFlight:
    """How many requests are being handled now, so a shutdown can wait for them."""

    def __init__(self) -> None:
        self.count = 0


IN_FLIGHT = web.AppKey("in_flight", InFlight)


class KeptReuse:
    """The reuse headers of the verify answers the setting alone bounds, with the whole
    second and the setting they were made for (keysvc.http.reuse): one tuple, read and
    replaced whole."""

    def __init__(self) -> None:
        self.kept: tuple[int, int, Mapping[str, str] | None] = (-1, 0, None)


KEPT_REUSE = web.AppKey("kept_reuse", KeptReuse)

REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Key)
# The client address keysvc believes for an admitted caller (keysvc.http.auth.client_address),
# for the activities its writes record; None when it is unknown.
CLIENT_ADDRESS: web.RequestKey[str | None] = web.RequestKey("client_address")
# Set by keysvc.http.auth where each outcome is decided; read by the access log and metrics.
AUTH_OUTCOME: web.RequestKey[AuthReason] = web.RequestKey("auth_outcome")
# A refusal a view made after authentication that usage counts as its own outcome
# (verify's "credits_exhausted", issue 29), rather than as the authentication's.
USAGE_REFUSAL: web.RequestKey[str] = web.RequestKey("usage_refusal")
# The admitted caller's request-limit standing, when a limit applies (verify's JSON answer).
RATE_DECISION: web.RequestKey[Decision] = web.RequestKey("rate_decision")
# The key whose secret a request proved, and the minute it was checked in, whether the
# key was then admitted or refused: what its usage is counted under (keysvc.http.auth).
PROVEN: web.RequestKey[tuple[str, datetime]] = web.RequestKey("proven")
# Set when the caller authenticated with its key's previous credentials, in their grace
# period after a rotation (keysvc.domain.keys.rotate_key); absent otherwise.
PREVIOUS_CREDENTIAL = web.RequestKey("previous_credential", bool)
