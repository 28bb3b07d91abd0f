"""``CoreFront``: the contract's calls that both stores answer alike, forwarded once to
the ``StoreCore`` each holds. ``keysvc.db.sqlite.store.Store`` and
``keysvc.db.postgres.store.PgStore`` mix it in beside their own calls, so that a
call added to the contract and the core is written once, not once per backend.
"""

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from keysvc.db.activities import Chain
from keysvc.db.contract import Connection, Rendered, RevokedUse, SecretHolder, Space
from keysvc.db.core import StoreCore, UsageUpkeep
from keysvc.db.identities import IdentityStore
from keysvc.db.roles import RoleStore
from keysvc.db.seal import Seal
from keysvc.models import (
    Activity,
    ActivityKinds,
    ActivityPage,
    Credential,
    Delivery,
    Key,
    KeyPage,
    Spend,
    SpendRule,
    Spent,
    Webhook,
)


class CoreFront:
    _core: StoreCore
    space: Space
    chain: Chain
    roles: RoleStore
    identities: IdentityStore
    seal: Seal
    needs_touch: Callable[[Key, datetime], bool]
    count_use: Callable[[str, datetime, int], None]

    def _front(self, core: StoreCore) -> None:
        """Answer the shared calls with ``core``; called once, from the store's __init__."""
        self._core = core
        self.space = core.space
        self.chain = core.chain
        self.roles = core.roles
        self.identities = core.identities
        self.seal = core.seal
        # Asked on every authenticated request, so bound once rather than forwarded.
        self.needs_touch = core.touches.needs_touch
        self.count_use = core.touches.tally.add

    def transaction(
        self, operation: str, timed: bool = True
    ) -> AbstractAsyncContextManager[Connection]:
        """One write transaction (``StoreCore.transaction``)."""
        return self._core.transaction(operation, timed)

    def authorization_changed(self, conn: Connection) -> Awaitable[None]:
        """Inside a transaction: what some key may do has changed. Bumps the generation."""
        return self._core.writer.authorization_changed(conn)

    def record(
        self, conn: Connection, activity: Activity, revoking: bool = False
    ) -> Awaitable[None]:
        return self._core.record(conn, activity, revoking)

    def recorded_pepper(self) -> Awaitable[str | None]:
        return self._core.recorded_pepper()

    def check_pepper(self, fingerprint: str) -> Awaitable[None]:
        return self._core.check_pepper(fingerprint)

    def key_activities(self, key: bytes) -> Awaitable[None]:
        return self._core.key_activities(key)

    def enqueue(
        self, conn: Connection, organization_id: str, event_type: str, data: dict[str, Any],
        now: datetime, webhook_ids: Collection[str] | None = None, revoking: bool = False,
    ) -> Awaitable[None]:  # fmt: skip
        return self._core.enqueue(
            conn, organization_id, event_type, data, now, webhook_ids, revoking
        )

    def key_outbox(self, key: bytes) -> None:
        self._core.key_outbox(key)

    async def start_upkeep(self, upkeep: UsageUpkeep) -> None:
        """Not in the contract: only opening a serving store (``keysvc.db.backends``)
        starts it, once the pepper has keyed the store; answered once its first round
        is done, so that a worker that says it serves holds no start-up write, which a
        stopped worker (a debugger, SIGSTOP) would keep from the others."""
        self._core.start_upkeep(upkeep)
        await self._core.first_upkeep()

    def has_organization(self) -> Awaitable[bool]:
        return self._core.has_organization()

    def organization_ids(self) -> Awaitable[list[str]]:
        return self._core.organization_ids()

    # Cached answers: synchronous, no statement; None (or a render) when not cached.

    def data_version(self) -> int:
        return self._core.caches.data_version()

    def cached_key(self, organization_id: str, key_id: str) -> Key | None:
        return self._core.caches.cached_key(organization_id, key_id)

    def cached_credential(self, key_id_hash: bytes) -> Credential | None:
        return self._core.caches.cached_credential(key_id_hash)

    def proven_credential(self, proof: bytes) -> Credential | None:
        return self._core.caches.proven_credential(proof)

    def remember_proof(self, proof: bytes, key_id_hash: bytes, credential: Credential) -> None:
        self._core.caches.remember_proof(proof, key_id_hash, credential)

    def cached_page(
        self, key: tuple[object, ...], render: Callable[[], Awaitable[Rendered]]
    ) -> Awaitable[Rendered]:
        return self._core.caches.page(key, render)

    def spend_credits(
        self, organization_id: str, key_id: str, now: datetime, rule: SpendRule
    ) -> Awaitable[Spend | None]:
        return self._core.spend_credits(organization_id, key_id, now, rule)

    def spend_shared(
        self, organization_id: str, key_id: str, external_id: str, now: datetime,
        rule: SpendRule, identity_rule: SpendRule,
    ) -> Awaitable[Spent]:  # fmt: skip
        return self._core.spend_shared(
            organization_id, key_id, external_id, now, rule, identity_rule
        )

    # Reads

    def get_key(self, organization_id: str, key_id: str) -> Awaitable[Key | None]:
        return self._core.get_key(organization_id, key_id)

    def list_keys(
        self, organization_id: str, after: int, limit: int, external_id: str | None = None
    ) -> Awaitable[KeyPage]:
        return self._core.list_keys(organization_id, after, limit, external_id)

    def find_credential(
        self, key_id_hash: bytes, offered: bytes | None = None
    ) -> Awaitable[Credential | None]:
        return self._core.find_credential(key_id_hash, offered)

    def read_as_uncached(self, key_id_hash: bytes) -> Awaitable[None]:
        return self._core.read_as_uncached(key_id_hash)

    def keys_with_secret(
        self, conn: Connection, secret_hash: bytes, now: datetime
    ) -> Awaitable[list[SecretHolder]]:
        return self._core.keys_with_secret(conn, secret_hash, now)

    def note_revoked_use(
        self, key_id: str, moment: datetime, make: Callable[[], RevokedUse]
    ) -> None:
        self._core.note_revoked_use(key_id, moment, make)

    def get_activity(self, organization_id: str, activity_id: str) -> Awaitable[Activity | None]:
        return self._core.get_activity(organization_id, activity_id)

    def list_activities(
        self,
        organization_id: str,
        after: int,
        limit: int,
        since: datetime | None = None,
        until: datetime | None = None,
        kinds: ActivityKinds | None = None,
        max_bytes: int | None = None,
    ) -> Awaitable[ActivityPage]:
        return self._core.list_activities(
            organization_id, after, limit, since, until, kinds, max_bytes
        )

    def list_webhooks(self, organization_id: str) -> Awaitable[list[Webhook]]:
        return self._core.list_webhooks(organization_id)

    def get_webhook(self, organization_id: str, webhook_id: str) -> Awaitable[Webhook | None]:
        return self._core.get_webhook(organization_id, webhook_id)

    def delivery_page(
        self, webhook_id: str, before: int | None, limit: int
    ) -> Awaitable[tuple[list[Delivery], bool, int]]:
        return self._core.delivery_page(webhook_id, before, limit)

    # Usage

    def touch_used(self, key_id: str, minute: datetime) -> Awaitable[None]:
        return self._core.touch_used(key_id, minute)

    def write_usage(self) -> Awaitable[None]:
        """Write this process's usage counts now, rather than at the next flush."""
        return self._core.touches.write_counts()

    def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Awaitable[Mapping[str, Sequence[int]]]:
        return self._core.usage_series(key_id, start, end, width)
