"""The records the store returns and takes: plain frozen dataclasses, no I/O."""

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from keysvc.timeutil import to_text


@dataclass(frozen=True)
class Role:
    id: str
    name: str
    type: str
    permissions: tuple[str, ...]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RoleDetail:
    """A role as seen from one organization, with the keys that hold it there."""

    role: Role
    organization_id: str
    actors: tuple[str, ...]


@dataclass(frozen=True)
class RolePage:
    roles: list[RoleDetail]
    more: bool
    total: int


@dataclass(frozen=True)
class Organization:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True)
class Refill:
    """A key's credit refill: ``amount`` at 00:00 UTC of each day (``daily``) or of day
    ``day`` of each month (``monthly``; past the month's end, its last day)."""

    interval: str
    amount: int
    day: int = 1


@dataclass(frozen=True)
class Credits:
    """A key's credits as stored: ``remaining``, its refill (None: never), when that is
    next due (``keysvc.domain.credits``), the last set or refill amount (``base``: what
    ``key.credits_low`` is measured against) and which credit events were sent since
    (``flags``: ``LOW_SENT``, ``EXHAUSTED_SENT``). ``revision`` is drawn anew by each
    change an admin makes (create, PATCH, ``POST .../credits``), kept by spends and
    refills: the key's ETag covers it, so a PATCH with an ETag read before another
    admin's change is refused (412), while spends never make one stale. Compared
    credits are equal whatever their revisions."""

    remaining: int
    refill: Refill | None = None
    next_refill_at: datetime | None = None
    base: int = 0
    flags: int = 0
    revision: int = field(default=0, compare=False)


LOW_SENT, EXHAUSTED_SENT = 1, 2


class Spend(NamedTuple):
    """What a spend of credits decided (``keysvc.domain.credits.spent``): whether it is
    allowed, the credits after it, and the events to send in its transaction, each
    (type, data). A tuple, made on every verify that spends: a frozen dataclass sets
    each field through ``object.__setattr__``."""

    allowed: bool
    credits: Credits
    events: Sequence[tuple[str, dict[str, Any]]] = ()


# The domain's rule for a spend, from the key's credits as stored (Store.spend_credits).
SpendRule = Callable[[Credits], Spend]


class Spent(NamedTuple):
    """A verify's spend from its key's credits and its identity's (issue 36), each None
    when unlimited: allowed only if both allow it, and then both are spent; a refusal
    spends from neither (the refusing side's due refill and events are kept). A tuple,
    as ``Spend`` is."""

    key: Spend | None = None
    identity: Spend | None = None

    @property
    def allowed(self) -> bool:
        return all(spend is None or spend.allowed for spend in (self.key, self.identity))


@dataclass(frozen=True)
class Key:
    id: str
    seq: int
    organization_id: str
    name: str
    state: str
    key_suffix: str
    created_at: datetime
    expire_at: datetime | None
    used_at: datetime | None
    ip_access_list: list[dict[str, str]]
    roles: tuple[Role, ...]
    # (limit, window in seconds) of this key's own request limit; None: the server's.
    rate_limit: tuple[int, int] | None = None
    # Its place in its organization's creation order (1, 2, ...): what list cursors
    # carry, so that they tell nothing of other organizations' keys.
    org_seq: int = 0
    # When the credentials its last rotation replaced stop working; None if it kept none.
    previous_until: datetime | None = None
    # Issue 29: who the key is for in the caller's own system, its free-form metadata
    # (a JSON object, as given) and its credits (None: unlimited).
    external_id: str | None = None
    meta: Mapping[str, Any] | None = None
    credits: Credits | None = None
    # Issue 36: its named rate limits in their stored form, a JSON array of their wire
    # entries (keysvc.domain.namedlimits.dumps; None: none), so that every layer can
    # show them and the domain parses them once per text (keysvc.domain.namedcount).
    ratelimits: str | None = None

    # Cached: a Key never changes (a change is a new Key), and the hot paths ask each
    # request. cached_property stores beside the fields, so the frozen class allows it.
    @cached_property
    def permissions(self) -> frozenset[str]:
        return frozenset(p for role in self.roles for p in role.permissions)

    @cached_property
    def etag(self) -> str:
        """A strong ETag of what a PATCH can change and of what the key may do: its
        roles' permissions are covered, so widening a role moves the ETag of every
        key that holds it. usedAt is not: it moves on its own; neither are the credits a
        spend or a refill leaves, but each change an admin makes to them is (their
        ``revision``)."""
        state: list[Any] = [
            self.name,
            self.state,
            to_text(self.expire_at) if self.expire_at else None,
            self.ip_access_list,
            [(role.id, role.name, sorted(role.permissions)) for role in self.roles],
            self.rate_limit,
        ]
        if self.external_id is not None or self.meta is not None or self.credits is not None:
            refill = None if self.credits is None else self.credits.refill
            limited = self.credits is not None
            plan = None if refill is None else [refill.interval, refill.amount, refill.day]
            revision = None if self.credits is None else self.credits.revision
            state.append([self.external_id, self.meta, limited, plan, revision])
        if self.ratelimits is not None:
            state.append(["ratelimits", self.ratelimits])
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        return f'"{digest[:20]}"'


@dataclass(frozen=True)
class Identity:
    """Issue 36: who several keys are for (a customer), by ``external_id``, unique in its
    organization: its keys (those of the organization with that externalId) share its
    credits and named limits. ``ratelimits``: the limits' stored form
    (``keysvc.domain.namedlimits.dumps``), None for none; ``org_seq``: its place in its
    organization's list."""

    id: str
    organization_id: str
    org_seq: int
    external_id: str
    meta: Mapping[str, Any] | None
    credits: Credits | None
    ratelimits: str | None
    created_at: datetime
    updated_at: datetime

    @cached_property
    def etag(self) -> str:
        """A strong ETag of what a PATCH can change (as ``Key.etag``: spends and refills
        leave it, an admin's change to the credits moves it)."""
        credits = self.credits
        plan = None if credits is None or credits.refill is None else credits.refill
        state = [
            self.meta,
            self.ratelimits,
            credits is not None,
            None if plan is None else [plan.interval, plan.amount, plan.day],
            None if credits is None else credits.revision,
        ]
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        return f'"{digest[:20]}"'


@dataclass(frozen=True)
class IdentityPage:
    identities: list[Identity]
    more: bool
    total: int


@dataclass(frozen=True)
class Credential:
    """What authentication needs: the key, and the keyed hash of the secret that goes
    with the key ID it was found by. ``until``: that key ID is the key's previous one,
    which stops working then (``keysvc.domain.keys.rotate_key``); None for its current one.
    ``deleted``: a deleted key's tombstone, never a working credential (``key`` then
    carries only its UUID and organization, and the state ``deleted``). ``rotated``: the
    tombstone of credentials a rotation replaced, of a key that still exists; never a
    working credential either (``key`` as for ``deleted``)."""

    key: Key
    secret_hash: bytes = field(repr=False)
    until: datetime | None = None
    deleted: bool = False
    rotated: bool = False

    def usable_at(self, now: datetime) -> bool:
        """Whether this credential still works at ``now``; the key's own state and
        expiry are checked apart (``keysvc.http.auth.authenticate``)."""
        return not self.rotated and (self.until is None or now < self.until)

    def replaced_at(self, now: datetime) -> bool:
        """Whether these are credentials a rotation replaced, their grace over at ``now``."""
        return self.rotated or (self.until is not None and now >= self.until)


@dataclass(frozen=True)
class NewKey:
    organization_id: str
    name: str
    state: str
    key_id_hash: bytes = field(repr=False)
    secret_hash: bytes = field(repr=False)
    key_suffix: str
    created_at: datetime
    expire_at: datetime | None = None
    ip_access_list: list[dict[str, str]] = field(default_factory=list)
    role_ids: Sequence[str] = ()
    rate_limit: tuple[int, int] | None = None
    external_id: str | None = None
    meta: Mapping[str, Any] | None = None
    credits: Credits | None = None
    ratelimits: str | None = None


@dataclass(frozen=True)
class KeyChange:
    """A PATCH, already validated: None means "leave as it is"."""

    name: str | None = None
    state: str | None = None
    expire_at: datetime | None = None
    clear_expiry: bool = False
    ip_access_list: list[dict[str, str]] | None = None
    role_ids: Sequence[str] | None = None
    rate_limit: tuple[int, int] | None = None
    clear_rate_limit: bool = False
    external_id: str | None = None
    clear_external_id: bool = False
    meta: Mapping[str, Any] | None = None
    clear_meta: bool = False
    # The credits as they are to be (None: unlimited), when ``set_credits``.
    credits: Credits | None = None
    set_credits: bool = False
    # The named rate limits as they are to be, stored form (None: none), when
    # ``set_ratelimits``.
    ratelimits: str | None = None
    set_ratelimits: bool = False


@dataclass(frozen=True)
class KeyPage:
    keys: list[Key]
    more: bool
    total: int
    identity_ids: Mapping[str, str] = field(default_factory=dict)  # key UUID -> identity's


@dataclass(frozen=True)
class Actor:
    """Who made a change: a key over the API (``api``: its UUID, the client address
    keysvc believes and the User-Agent), or keysvc itself (``system``: the CLI)."""

    type: str
    id: str | None = None
    ip: str | None = None
    user_agent: str | None = None
    details: str | None = None


@dataclass(frozen=True)
class JsonText:
    """A value already encoded as ``keysvc.db.activities`` encodes an activity's
    ``before`` and ``after`` (``json.dumps`` with sorted keys, not ASCII-escaped): an
    import's thousands of keys are encoded one by one where they are planned
    (``keysvc.domain.imports``), not again as one value in its transaction."""

    text: str


@dataclass(frozen=True)
class Activity:
    """One entry of an organization's activity log. ``before`` and ``after`` hold the
    public values of what changed (never a secret or a hash); ``org_seq`` is its place
    in the organization's hash chain, given when it is recorded."""

    organization_id: str
    type: str
    actor: Actor
    created_at: datetime
    key_update_type: str | None = None
    target_key_id: str | None = None
    target_role_id: str | None = None
    before: Mapping[str, Any] | None = None
    after: Mapping[str, Any] | JsonText | None = None
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    org_seq: int = 0


@dataclass(frozen=True)
class ActivityKinds:
    """Which records an activity list shows: those of ``types`` whose keyUpdateType,
    when they have one, is among ``update_types``."""

    types: tuple[str, ...]
    update_types: tuple[str, ...]


@dataclass(frozen=True)
class ActivityPage:
    activities: list[Activity]
    more: bool
    total: int


@dataclass(frozen=True)
class Webhook:
    seq: int
    id: str
    organization_id: str
    url: str
    events: tuple[str, ...]
    expiring_days: int
    nonce: bytes
    created_at: datetime
    # Until when a rotation's previous secret still signs; since when every attempt
    # has failed; when it was disabled (None: enabled). keysvc.domain.webhooks.
    previous_until: datetime | None = None
    failing_since: datetime | None = None
    disabled_at: datetime | None = None

    @property
    def enabled(self) -> bool:
        return self.disabled_at is None


@dataclass(frozen=True)
class Attempt:
    at: datetime
    status: int | None
    error: str | None


@dataclass(frozen=True)
class Delivery:
    seq: int
    id: str
    event_id: str
    event_type: str
    created_at: datetime
    state: str
    attempts: tuple[Attempt, ...]
    next_attempt_at: datetime | None
