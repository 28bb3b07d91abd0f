"""Soak: a bounded mixed load against a real server, watching what would creep.

Clients create, read, list, patch, delete and verify keys, and fail to log in,
for a fixed time. Expected: no 5xx at all, resident memory at the end within
10% of what it was a third of the way in (60 s: the 20th against the 60th
second), and no more file descriptors at the end than then.

``make test`` runs a short form (KEYSVC_SOAK_SECONDS, default 9, after 10 seconds
of warm-up); ``make soak`` runs the full 60 seconds and prints the figures.
"""

import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import basic
from tests.server import Server, bootstrap

SECONDS = float(os.environ.get("KEYSVC_SOAK_SECONDS", "9"))
# Load before the measured window. The full form needs none: its first sample, at
# the 20th second, comes after the caches have filled. The short form would sample
# at its 3rd second, while they are still filling (bounded, but not yet full).
WARMUP = float(os.environ.get("KEYSVC_SOAK_WARMUP", "10" if SECONDS < 60 else "0"))
CLIENTS = 16
POOL = 150  # keys kept alive at once; older ones are deleted
SEED = 20261121


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Load:
    base: str
    organization_id: str
    admin: dict[str, str]
    keys: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (id, headers)
    statuses: Counter[int] = field(default_factory=Counter)
    fives: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.base}/v1/organizations/{self.organization_id}/keys"

    async def call(self, http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> Any:
        async with http.request(method, url, **kw) as response:
            body = await response.read()
            self.statuses[response.status] += 1
            if response.status >= 500:
                self.fives.append(f"{method} {url}: {response.status} {body[:200]!r}")
            return response.status, body

    async def step(self, http: aiohttp.ClientSession, rng: random.Random) -> None:
        roll = rng.random()
        if roll < 0.15 or not self.keys:
            status, body = await self.call(
                http,
                "POST",
                self.url,
                json={"name": "soak", "roles": ["developer"]},
                headers=self.admin,
            )
            if status == 200:
                result = json.loads(body)["result"]
                self.keys.append((result["key"]["id"], basic(result["keyId"], result["keySecret"])))
            while len(self.keys) > POOL:
                old, _ = self.keys.pop(0)
                await self.call(http, "DELETE", f"{self.url}/{old}", headers=self.admin)
        elif roll < 0.45:
            _, headers = rng.choice(self.keys)
            await self.call(http, "GET", f"{self.base}/v1/verify", headers=headers)
        elif roll < 0.65:
            key, headers = rng.choice(self.keys)
            await self.call(http, "GET", f"{self.url}/{key}", headers=headers)
        elif roll < 0.75:
            await self.call(http, "GET", f"{self.url}?limit=50", headers=self.admin)
        elif roll < 0.85:
            key, _ = rng.choice(self.keys)
            await self.call(
                http,
                "PATCH",
                f"{self.url}/{key}",
                json={"name": f"soak {rng.randrange(10**6)}"},
                headers=self.admin,
            )
        elif roll < 0.95:
            await self.call(http, "GET", f"{self.base}/v1/whoami", headers=basic("x" * 20, "y"))
        else:
            await self.call(http, "GET", f"{self.base}/v1/whoami", headers=self.admin)


async def drive(load: Load, pid: int, seconds: float, warmup: float) -> dict[str, int]:
    """Runs the load for ``warmup`` then ``seconds``; samples memory and descriptors
    a third of the way into the measured window and at its end."""
    samples: dict[str, int] = {}
    deadline = time.monotonic() + warmup + seconds
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def client(number: int) -> None:
            rng = random.Random(SEED + number)
            while time.monotonic() < deadline:
                await load.step(http, rng)

        async def sampler() -> None:
            await asyncio.sleep(warmup + seconds / 3)
            samples["rss_early"], samples["fds_early"] = rss_kib(pid), fds(pid)
            await asyncio.sleep(max(0.0, deadline - time.monotonic() - 0.2))
            samples["rss_late"], samples["fds_late"] = rss_kib(pid), fds(pid)

        await asyncio.gather(sampler(), *(client(n) for n in range(CLIENTS)))
    return samples


def test_soak(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    admin = basic(created["keyId"], created["keySecret"])
    env = {"KEYSVC_AUTH_FAILURES": "1000000", "KEYSVC_MAX_KEYS_PER_ORG": "100000"}
    with Server(db, env=env) as server:
        load = Load(server.base, created["organizationId"], admin)
        samples = asyncio.run(drive(load, server.proc.pid, SECONDS, WARMUP))
        server.stop()
        assert server.proc.returncode == 0
    growth = samples["rss_late"] / samples["rss_early"] - 1
    total = sum(load.statuses.values())
    print(
        f"\nsoak {SECONDS:.0f} s: {total} requests, statuses {dict(load.statuses)};"
        f" RSS {samples['rss_early']} -> {samples['rss_late']} KiB ({growth:+.1%});"
        f" fds {samples['fds_early']} -> {samples['fds_late']}"
    )
    assert load.fives == []
    assert total > 50 * SECONDS  # it was really under load
    assert load.statuses[401] > 0 and load.statuses[200] > total / 2
    assert growth < 0.10
    assert samples["fds_late"] <= samples["fds_early"]
