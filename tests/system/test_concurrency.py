"""Many concurrent clients on one organization: no 5xx, no lock error, no lost update.

Each client has its own connection and mixes creates, reads, lists, PATCHes
with and without If-Match, and DELETEs over a shared pool of keys. Every
answer is recorded with when it was sent and when it came back, then checked
against what the server holds at the end. Every PATCH sets a name no other
request ever sends, so the final name of a key tells which write came last.

The server runs as one process, then as two sharing the port: there, two
writer connections really contend for SQLite's write lock.
"""

import asyncio
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import Creds
from tests.server import Server, admin_creds, bootstrap, listed_keys

SEED = 50
CLIENTS = 56
OPS = 20  # per client
POOL_START = 40  # keys created before the clients start, so they meet at once
TIMEOUT = aiohttp.ClientTimeout(total=60)
# What each operation may answer; anything else fails the test.
ALLOWED = {
    "create": {200},
    "get": {200, 404},
    "list": {200},
    "patch": {200, 404},
    "patch-if-match": {200, 404, 412},
    "delete": {200, 404},
}


@dataclass
class Answer:
    client: int
    op: str
    key: str | None  # the key's UUID, for operations on one key
    sent: float  # loop time before the request went out
    answered: float  # loop time once the whole answer was read
    status: int
    raw: str = field(repr=False)
    body: dict[str, Any] = field(repr=False)
    name: str | None = None  # the name a create or PATCH sent
    etag: str | None = None  # the answer's ETag header
    if_match: str | None = None  # the If-Match a PATCH sent


@dataclass
class Run:
    base: str
    admin: Creds
    pool: list[str] = field(default_factory=list)  # keys created and not known deleted
    answers: list[Answer] = field(default_factory=list)

    @property
    def keys_url(self) -> str:
        return f"{self.base}/v1/organizations/{self.admin.organization_id}/keys"

    async def call(
        self,
        session: aiohttp.ClientSession,
        client: int,
        op: str,
        method: str,
        url: str,
        key: str | None = None,
        *,
        name: str | None = None,
        if_match: str | None = None,
        **kwargs: Any,
    ) -> Answer:
        """Send one request and record its answer; ``name`` is sent as the key's name."""
        if name is not None:
            kwargs["json"] = {"name": name, **({"roles": ["developer"]} if op == "create" else {})}
        if if_match is not None:
            kwargs["headers"] = {"If-Match": if_match}
        loop = asyncio.get_running_loop()
        sent = loop.time()
        async with session.request(method, url, **kwargs) as response:
            raw = await response.text()
        answer = Answer(
            client, op, key, sent, loop.time(), response.status, raw, json.loads(raw), name
        )
        answer.etag, answer.if_match = response.headers.get("ETag"), if_match
        self.answers.append(answer)
        return answer

    async def create(self, session: aiohttp.ClientSession, client: int, name: str) -> None:
        answer = await self.call(session, client, "create", "POST", self.keys_url, name=name)
        if answer.status == 200:
            answer.key = answer.body["result"]["key"]["id"]
            self.pool.append(answer.key)

    async def client(self, number: int) -> None:
        rng = random.Random(SEED * 1000 + number)
        async with aiohttp.ClientSession(headers=self.admin.headers, timeout=TIMEOUT) as session:
            for seq in range(OPS):
                name = f"c{number:02d}-{seq:04d}"
                roll = rng.random()
                if roll < 0.2 or not self.pool:
                    await self.create(session, number, name)
                elif roll < 0.3:
                    await self.list_pages(session, number, rng.choice([1, 7, 50]))
                else:
                    await self.on_one_key(session, number, rng.choice(self.pool), name, roll)

    async def on_one_key(
        self, session: aiohttp.ClientSession, client: int, key: str, name: str, roll: float
    ) -> None:
        url = f"{self.keys_url}/{key}"
        if roll < 0.45:
            await self.call(session, client, "get", "GET", url, key)
        elif roll < 0.7:
            read = await self.call(session, client, "get", "GET", url, key)
            if read.status == 200:
                assert read.etag is not None
                op = "patch-if-match"
                await self.call(
                    session, client, op, "PATCH", url, key, name=name, if_match=read.etag
                )
        elif roll < 0.9:
            await self.call(session, client, "patch", "PATCH", url, key, name=name)
        else:
            gone = await self.call(session, client, "delete", "DELETE", url, key)
            if gone.status == 200:
                self.pool.remove(key)

    async def list_pages(self, session: aiohttp.ClientSession, client: int, limit: int) -> None:
        """Up to three pages; the IDs of one listing never repeat."""
        seen: list[str] = []
        params = {"limit": str(limit)}
        for _ in range(3):
            page = await self.call(session, client, "list", "GET", self.keys_url, params=params)
            if page.status != 200:
                return
            seen += [key["id"] for key in page.body["result"]]
            assert len(seen) == len(set(seen)), "a key appeared twice in one listing"
            cursor = page.body.get("nextCursor")
            if not cursor:
                return
            params = {"limit": str(limit), "cursor": cursor}


def check_answers(run: Run) -> None:
    """Every answer is one the operation may give, in a whole envelope, never a lock error."""
    for answer in run.answers:
        assert answer.status < 500, answer
        assert "locked" not in answer.raw.lower(), answer
        assert "database" not in answer.raw.lower(), answer
        assert answer.status in ALLOWED[answer.op], answer
        assert answer.body["status"] == answer.status, answer
        if answer.status != 200:
            assert set(answer.body) == {"status", "error", "requestId"}, answer
        elif answer.op == "create":
            assert answer.body["result"]["key"]["name"] == answer.name, answer
        elif answer.op.startswith("patch"):
            assert answer.body["result"]["name"] == answer.name, answer


def check_writes(run: Run, final: dict[str, str]) -> None:
    """No lost update, no write on a deleted key, no 404 before a delete."""
    by_key: dict[str, list[Answer]] = defaultdict(list)
    for answer in run.answers:
        if answer.key is not None:
            by_key[answer.key].append(answer)
    for key, answers in by_key.items():
        (create,) = [a for a in answers if a.op == "create" and a.status == 200]
        patches = [a for a in answers if a.op.startswith("patch") and a.status == 200]
        deletes = [a for a in answers if a.op == "delete" and a.status == 200]
        assert len(deletes) <= 1, deletes
        # A 404 only for a key whose delete had been sent by the time the 404 came back.
        for answer in answers:
            if answer.status == 404:
                assert deletes and deletes[0].sent < answer.answered, (answer, deletes)
        if deletes:
            (delete,) = deletes
            assert key not in final, key
            # Nothing succeeded on the key once its deletion had been answered.
            for answer in answers:
                if answer.status == 200 and answer is not delete:
                    assert answer.sent < delete.answered, (answer, delete)
            continue
        assert key in final, f"a key nobody deleted is gone: {key}"
        names = {a.name: a for a in [create, *patches]}
        last = names.get(final[key])
        assert last is not None, f"{key} is named {final[key]!r}, which no 200 wrote"
        # The write that came last may not have been answered before another
        # acknowledged PATCH of the same key was sent: that PATCH came after it.
        for patch in patches:
            if patch is not last:
                assert not last.answered < patch.sent, f"lost update: {patch} under {last}"


def check_if_match(run: Run) -> None:
    """One ETag lets at most one PATCH of its key through: the others answer 412."""
    winners: dict[tuple[str | None, str | None], Answer] = {}
    for answer in run.answers:
        if answer.op == "patch-if-match" and answer.status == 200:
            precondition = (answer.key, answer.if_match)
            assert precondition not in winners, (winners[precondition], answer)
            winners[precondition] = answer


def check_reads(run: Run) -> None:
    """A read shows a state some 200 wrote, and never one already overwritten before it.

    A write is overwritten for certain when another write of the same key was
    sent after it was answered, and answered before the read was sent.
    """
    writes: dict[str | None, dict[str | None, Answer]] = defaultdict(dict)
    for answer in run.answers:
        if answer.op in ("create", "patch", "patch-if-match") and answer.status == 200:
            writes[answer.key][answer.name] = answer
    for answer in run.answers:
        if answer.op == "get" and answer.status == 200:
            seen = [(answer.key, answer.body["result"]["name"])]
        elif answer.op == "list":
            result = answer.body["result"]
            seen = [(key["id"], key["name"]) for key in result if key["id"] != run.admin.id]
        else:
            continue
        for key, name in seen:
            shown = writes[key].get(name)
            assert shown is not None, f"{answer} shows {name!r}, which no 200 wrote"
            for later in writes[key].values():
                assert not (shown.answered < later.sent and later.answered < answer.sent), (
                    f"stale read: {answer} shows {shown} after {later}"
                )


@pytest.mark.parametrize("workers", [1, 2])
async def test_concurrent_clients_lose_no_update(tmp_path: Path, workers: int) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    admin = admin_creds(created)
    env = {"KEYSVC_MAX_KEYS_PER_ORG": "100000", "KEYSVC_WORKERS": str(workers)}
    with Server(db, env=env) as server:
        run = Run(server.base, admin)
        async with aiohttp.ClientSession(headers=admin.headers, timeout=TIMEOUT) as session:
            await asyncio.gather(
                *(run.create(session, -1, f"pool-{n:03d}") for n in range(POOL_START))
            )
        await asyncio.gather(*(run.client(n) for n in range(CLIENTS)))
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            final, total = await listed_keys(session, server.base, admin)
        server.stop()
        assert server.proc.returncode == 0

    check_answers(run)
    ops = {answer.op for answer in run.answers}
    assert ops == set(ALLOWED), ops
    statuses = {(answer.op, answer.status) for answer in run.answers}
    # The races happened: some If-Match lost, some request found its key deleted.
    assert ("patch-if-match", 412) in statuses and ("patch-if-match", 200) in statuses
    assert any(status == 404 for _, status in statuses)
    creates = sum(1 for a in run.answers if a.op == "create" and a.status == 200)
    deletes = sum(1 for a in run.answers if a.op == "delete" and a.status == 200)
    # totalCount counts every key of the organization, the admin key included.
    assert total == len(final) == 1 + creates - deletes
    assert final.pop(admin.id) is not None
    assert set(final) == set(run.pool)
    check_writes(run, final)
    check_if_match(run)
    check_reads(run)
