"""Spends of credits in group commits (issue 29): each spend waits for the next
write transaction of spends, which takes every spend that arrived while the one
before it ran. One commit (and so one fsync under ``synchronous=FULL``, or one
PostgreSQL commit) answers many verifies, and a spend alone waits for none.

A batch runs its spends one after another in one transaction, each reading the
credits as the ones before it left them (``keysvc.db.credits``): the order within a
batch is the order of arrival, and exactness is the transaction's. A spend is
answered only once its batch has committed. If a batch is refused, each of its spends
runs again alone, so that one spend's refusal (an event its webhook queue has no room
for, say) fails only that request. A batch that failed for the database
(``DatabaseUnavailable``) is never run again: its outcome may be unknown (a COMMIT
that reached PostgreSQL, its reply lost to a reset, a restart, a failover or a
pooler), and a spend run twice is credits charged twice. Each of its spends is
answered 503, and the client may ask again.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime

from keysvc.db.contract import Connection
from keysvc.errors import DatabaseUnavailable
from keysvc.models import SpendRule, Spent


class Pending:
    """A spend waiting for its batch: made on every verify that spends, so a class of
    slots (a dataclass's default factory costs a call more)."""

    __slots__ = (
        "answer",
        "external_id",
        "identity_rule",
        "key_id",
        "now",
        "organization_id",
        "rule",
    )

    def __init__(
        self,
        organization_id: str,
        key_id: str,
        now: datetime,
        rule: SpendRule,
        external_id: str | None = None,
        identity_rule: SpendRule | None = None,
    ):
        self.organization_id = organization_id
        self.key_id = key_id
        self.now = now
        self.rule = rule
        # Issue 36: the key's identity (by its externalId) and the rule for its credits.
        self.external_id = external_id
        self.identity_rule = identity_rule
        self.answer: asyncio.Future[Spent] = asyncio.get_running_loop().create_future()


# Runs a batch's spends, in order, on a connection inside a write transaction: the core's.
SpendAll = Callable[[Connection, Sequence[Pending]], Awaitable[list[Spent]]]
Transaction = Callable[[str], AbstractAsyncContextManager[Connection]]


class SpendBatches:
    """The spends waiting for a transaction, and the task that writes them."""

    def __init__(self, transaction: Transaction, spend_all: SpendAll):
        self._transaction = transaction
        self._spend_all = spend_all
        self._waiting: list[Pending] = []
        self._writer: asyncio.Task[None] | None = None

    async def spend(self, waiting: Pending) -> Spent:
        """``waiting``'s answer, once its batch has committed."""
        self._waiting.append(waiting)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        # A caller that goes away cancels its answer, never its spend: the spend is
        # already its batch's (taken whole by ``_write``), made and not acknowledged, as
        # an answer the batch finds done is never set. No shield: one future, awaited.
        return await waiting.answer

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                async with self._transaction("spend_credits") as conn:
                    answers = await self._spend_all(conn, batch)
            except DatabaseUnavailable as refused:
                # The spends that arrived meanwhile waited on the same database: refused
                # with this batch, with its reason, rather than each batch waiting as long
                # again (rt54 S1: a database lock held by another process).
                waited, self._waiting = self._waiting, []
                for item in (*batch, *waited):
                    if not item.answer.done():
                        item.answer.set_exception(DatabaseUnavailable(refused.message))
                continue
            except Exception:
                await self._alone(batch)
                continue
            for item, answer in zip(batch, answers, strict=True):
                if not item.answer.done():
                    item.answer.set_result(answer)

    async def _alone(self, batch: list[Pending]) -> None:
        for item in batch:
            try:
                async with self._transaction("spend_credits") as conn:
                    (answer,) = await self._spend_all(conn, [item])
            except Exception as exc:
                if not item.answer.done():
                    item.answer.set_exception(exc)
            else:
                if not item.answer.done():
                    item.answer.set_result(answer)

    async def finish(self) -> None:
        """Wait for the spends under way (a clean stop answers every one it took)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
