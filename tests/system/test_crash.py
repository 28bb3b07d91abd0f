"""Crash safety: a real server killed mid-stream, or stopped with SIGTERM, loses no
acknowledged write.

A stream of concurrent workers creates keys and PATCHes them over HTTP. Each
worker alone PATCHes the keys it created, one request at a time, and every
PATCH renames its key to the next number of that key's sequence; so after a
restart a key's name must carry a number at least that of its last
acknowledged PATCH, and at most that of the last one sent.

After ``kill -9`` a request that got no answer may or may not have been
applied. After SIGTERM the server must first answer every request it had
begun, and may apply nothing it did not answer.
"""

import asyncio
import json
import os
import random
import re
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from keysvc.cli.serve import SHUTDOWN_SECONDS
from tests.helpers import Creds
from tests.server import Server, admin_creds, bootstrap, integrity, listed_keys

SEED = 6
IN_FLIGHT = 24
ENV = {"KEYSVC_MAX_KEYS_PER_ORG": "100000"}
NAME = re.compile(r"w(\d\d)-k(\d{4})-(\d{6})")
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)


def key_name(worker: int, index: int, seq: int) -> str:
    return f"w{worker:02d}-k{index:04d}-{seq:06d}"


@dataclass
class Owned:
    """A key one worker created; only that worker PATCHes it, one request at a time."""

    worker: int
    index: int
    creds: Creds
    sent: int = 0  # the highest name number sent for it (its create sent 0)
    acked: int = 0  # the highest name number acknowledged with a 200


@dataclass
class Stream:
    """Workers creating and PATCHing keys; ``at_stop`` runs at the ``stop_after``-th 200.

    With ``keep_going`` each worker goes on until a request of its own fails,
    so the stop always cuts requests in flight; without it no worker starts
    another request once ``at_stop`` has run.
    """

    base: str
    admin: Creds
    stop_after: int
    at_stop: Callable[[], None]
    keep_going: bool = False
    owned: list[Owned] = field(default_factory=list)
    sent_creates: set[str] = field(default_factory=set)
    acks: int = 0
    unanswered: list[str] = field(default_factory=list)  # requests with no HTTP answer
    refused: list[str] = field(default_factory=list)  # answers other than 200
    request_ids: set[str] = field(default_factory=set)  # of every answer received
    answered_after_stop: int = 0
    stopped: bool = False

    @property
    def keys_url(self) -> str:
        return f"{self.base}/v1/organizations/{self.admin.organization_id}/keys"

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, headers=self.admin.headers, timeout=REQUEST_TIMEOUT
        ) as session:
            await asyncio.gather(*(self._worker(session, n) for n in range(IN_FLIGHT)))

    def _acknowledged(self) -> None:
        self.acks += 1
        if self.acks == self.stop_after:
            self.stopped = True
            self.at_stop()

    async def _send(
        self, session: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The 200 result, or None: no answer, or another answer (both recorded)."""
        what = f"{method} {body['name']}"
        try:
            async with session.request(method, url, json=body) as response:
                answer = await response.json()
        except (aiohttp.ClientError, ValueError) as exc:
            self.unanswered.append(f"{what}: {exc!r}")
            return None
        self.request_ids.add(response.headers["X-Request-Id"])
        if self.stopped:
            self.answered_after_stop += 1
        if response.status != 200:
            self.refused.append(f"{what}: {response.status} {answer}")
            return None
        result: dict[str, Any] = answer["result"]
        return result

    async def _worker(self, session: aiohttp.ClientSession, worker: int) -> None:
        rng = random.Random(SEED * 1000 + worker)
        mine: list[Owned] = []
        while self.keep_going or not self.stopped:
            if not mine or rng.random() < 0.4:
                name = key_name(worker, len(mine), 0)
                self.sent_creates.add(name)
                created = await self._send(
                    session, "POST", self.keys_url, {"name": name, "roles": ["developer"]}
                )
                if created is None:
                    return
                assert created["key"]["name"] == name
                creds = Creds(
                    self.admin.organization_id,
                    created["key"]["id"],
                    created["keyId"],
                    created["keySecret"],
                )
                mine.append(Owned(worker, len(mine), creds))
                self.owned.append(mine[-1])
            else:
                key = rng.choice(mine)
                key.sent += 1
                name = key_name(worker, key.index, key.sent)
                url = f"{self.keys_url}/{key.creds.id}"
                patched = await self._send(session, "PATCH", url, {"name": name})
                if patched is None:
                    return
                assert patched["name"] == name
                key.acked = key.sent
            self._acknowledged()


async def whoami(session: aiohttp.ClientSession, base: str, creds: Creds) -> tuple[int, Any]:
    async with session.get(f"{base}/v1/whoami", headers=creds.headers) as response:
        return response.status, await response.json()


async def check_survivors(
    base: str, admin: Creds, stream: Stream, *, exact: bool
) -> dict[str, str]:
    """Every acknowledged write is there; returns the keys no acknowledged create made.

    ``exact``: nothing unanswered was applied either, so each key's name is
    the one its last acknowledged PATCH (or its create) gave it.
    """
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        keys, total = await listed_keys(session, base, admin)
        assert total == len(keys)
        assert keys.pop(admin.id) is not None
        for owned in stream.owned:
            name = keys.pop(owned.creds.id, None)
            assert name is not None, f"acknowledged create lost: {owned}"
            match = NAME.fullmatch(name)
            assert match is not None, name
            assert (int(match[1]), int(match[2])) == (owned.worker, owned.index), (owned, name)
            # The last acknowledged PATCH, or a later one that was sent but not answered.
            assert owned.acked <= int(match[3]) <= (owned.acked if exact else owned.sent), (
                owned,
                name,
            )
        # Each acknowledged key still authenticates with the credentials it was given.
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def check(owned: Owned) -> None:
            async with limit:
                status, body = await whoami(session, base, owned.creds)
            assert status == 200, (owned, body)
            assert body["result"]["id"] == owned.creds.id

        await asyncio.gather(*(check(owned) for owned in stream.owned))
    # What is left can only come from creates that were sent and never answered.
    unanswered = stream.sent_creates - {key_name(o.worker, o.index, 0) for o in stream.owned}
    assert set(keys.values()) <= unanswered, keys
    return keys


def log_lines(text: str) -> list[dict[str, Any]]:
    """The server's stderr, every line of which must be one JSON object."""
    lines = []
    for line in text.splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict), line
        lines.append(entry)
    return lines


async def restarted_and_checked(
    db: Path, admin: Creds, stream: Stream, *, exact: bool
) -> dict[str, str]:
    """Restart on ``db``, check every acknowledged write, stop cleanly, check the file."""
    with Server(db, env=ENV) as server:
        extra = await check_survivors(server.base, admin, stream, exact=exact)
        server.stop(timeout=SHUTDOWN_SECONDS + 10)
        assert server.proc.returncode == 0, server.stderr_text()
    assert integrity(db) == ["ok"]
    return extra


@pytest.mark.parametrize("kill_after", [5, 40, 150])
async def test_kill_9_mid_stream_loses_no_acknowledged_write(
    tmp_path: Path, kill_after: int
) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env=ENV) as server:
        stream = Stream(
            server.base,
            admin,
            kill_after,
            lambda: os.kill(server.proc.pid, signal.SIGKILL),
            keep_going=True,
        )
        await stream.run()
        assert await asyncio.to_thread(server.proc.wait, 10) == -signal.SIGKILL
    assert stream.acks >= kill_after
    assert not stream.refused, stream.refused
    # Each worker went on until the kill left one request of its own without an answer.
    assert len(stream.unanswered) == IN_FLIGHT
    # Unanswered creates and PATCHes may or may not have been applied; nothing else may.
    await restarted_and_checked(db, admin, stream, exact=False)


async def test_sigterm_answers_every_request_it_began_and_exits_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env=ENV) as server:
        # Many concurrent creates share each fsync'd batch: the signal finds
        # handlers waiting on the database.
        stream = Stream(server.base, admin, 120, lambda: server.proc.send_signal(signal.SIGTERM))
        await stream.run()
        code = await asyncio.to_thread(server.proc.wait, SHUTDOWN_SECONDS + 10)
        assert code == 0, server.stderr_text()
        log = log_lines(server.stderr_text())

    assert not stream.refused, stream.refused
    # Requests were in flight when the signal came, and they were answered.
    assert stream.answered_after_stop > 0
    served = [e for e in log if e["message"] == "request" and e["method"] in ("POST", "PATCH")]
    assert len(served) >= stream.acks
    # Each request the server began, the client received (by request ID): a request
    # sent too late was refused unread, never begun and then dropped or cut off.
    assert {e["requestId"] for e in served} <= stream.request_ids
    assert {e["status"] for e in served} == {200}
    # A clean shutdown: nothing logged at error level, and the database was closed
    # (closing the last connection checkpoints the WAL and removes it).
    assert [e for e in log if e["level"] in ("error", "critical") or "exception" in e] == []
    assert not Path(f"{db}-wal").exists()
    extra = await restarted_and_checked(db, admin, stream, exact=True)
    assert extra == {}, "a create the client never saw answered was applied"


async def create_admin_key(session: aiohttp.ClientSession, url: str, admin: Creds) -> Creds:
    body = {"name": "caller", "roles": ["admin"]}
    async with session.post(url, json=body, headers=admin.headers) as response:
        answer = await response.json()
    assert response.status == 200, answer
    result = answer["result"]
    return Creds(admin.organization_id, result["key"]["id"], result["keyId"], result["keySecret"])


async def get_key(
    session: aiohttp.ClientSession, url: str, admin: Creds, key_id: str
) -> dict[str, Any]:
    async with session.get(f"{url}/{key_id}", headers=admin.headers) as response:
        answer = await response.json()
    assert response.status == 200, answer
    key: dict[str, Any] = answer["result"]
    return key


@dataclass
class SlowCreate:
    """A create whose body is held back until after SIGTERM: in flight, for certain."""

    release: asyncio.Event
    status: int | None = None
    error: str | None = None

    async def _body(self) -> AsyncIterator[bytes]:
        text = json.dumps({"name": "slow", "roles": ["developer"]}).encode()
        yield text[:5]
        await self.release.wait()
        yield text[5:]

    async def run(self, session: aiohttp.ClientSession, url: str, caller: Creds) -> None:
        headers = {**caller.headers, "Content-Type": "application/json"}
        try:
            async with session.post(url, data=self._body(), headers=headers) as response:
                self.status = response.status
                await response.read()
        except aiohttp.ClientError as exc:
            self.error = repr(exc)


async def test_sigterm_answers_a_request_whose_body_is_still_arriving(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    slow = SlowCreate(asyncio.Event())
    with Server(db, env=ENV) as server:
        url = f"{server.base}/v1/organizations/{admin.organization_id}/keys"
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
            caller = await create_admin_key(session, url, admin)
            task = asyncio.create_task(slow.run(session, url, caller))
            # Once the caller's usedAt is set the server has authenticated the slow
            # request, so its handler is running, waiting for the rest of the body.
            while "usedAt" not in await get_key(session, url, admin, caller.id):
                await asyncio.sleep(0.05)
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            slow.release.set()
            await task
        code = await asyncio.to_thread(server.proc.wait, SHUTDOWN_SECONDS + 10)
    assert code == 0
    assert (slow.status, slow.error) == (200, None)
