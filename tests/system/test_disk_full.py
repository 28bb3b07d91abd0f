"""A full disk: writes answer 507 "database disk is full" with a short log line now
and then, reads go on, /readyz is not ready, and writes resume by themselves once
there is space, with every acknowledged key still there (keysvc.db.sqlite.diskspace).

The database lives on a small tmpfs mounted for the test (it runs as root), filled
to the last byte, then grown with a remount."""

import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, FakeClock, assert_error, assert_ok, bootstrap, create_creds
from tests.server import integrity

FULL = "database disk is full: nothing was written; try again once the server has space"
# Creates tried, at most, before the disk must have refused one.
MAX_CREATES = 3000


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    done = _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where))
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs here (root needed): {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> None:
    """Write a file until the filesystem has not one byte left."""
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while os.write(fd, b"\0" * size) == size:
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


async def test_full_disk_refuses_writes_then_resumes(
    small_disk: Path, aiohttp_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    client = await aiohttp_client(
        create_app(Settings(db_path=small_disk / "keysvc.db"), clock=clock)
    )
    admin = await bootstrap(client.app)
    user = await create_creds(client, admin, {"name": "user", "roles": ["developer"]})
    keys_url = f"/v1/organizations/{admin.organization_id}/keys"
    fill(small_disk)
    caplog.set_level(logging.INFO, logger="keysvc")
    # Not ready before any write of this process fails: another worker's did, say.
    await assert_error(await client.get("/readyz"), 503, "not ready: the database disk is full")

    acknowledged = {admin.id, user.id}
    refused = 0
    for n in range(MAX_CREATES):
        response = await client.post(
            keys_url, json={"name": f"k{n}", "roles": ["developer"]}, headers=admin.headers
        )
        if response.status == 200:
            acknowledged.add((await response.json())["result"]["key"]["id"])
            continue
        await assert_error(response, 507, FULL)
        refused += 1
        if refused == 20:
            break
    assert refused == 20, "the disk never filled"

    # Short lines, and not one per refusal; no traceback.
    lines = [r for r in caplog.records if r.name == "keysvc" and "disk is full" in r.message]
    assert 1 <= len(lines) <= 2
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r not in lines]

    await assert_error(await client.get("/readyz"), 503, "not ready: the database disk is full")
    # Reads are served, usedAt writes (a new minute) included, which cannot be stored.
    clock.advance(minutes=1)
    listed = await assert_ok(await client.get(keys_url + "?limit=250", headers=user.headers))
    assert {key["id"] for key in listed} <= acknowledged
    await assert_ok(await client.get(f"{keys_url}/{user.id}", headers=user.headers))

    assert _mount("-o", "remount,size=64m", str(small_disk)).returncode == 0
    assert await assert_ok(await client.get("/readyz")) == {"status": "ready"}
    made = await create_creds(client, admin, {"name": "after", "roles": ["developer"]})
    acknowledged.add(made.id)
    assert any("writes resumed" in r.message for r in caplog.records)

    found: set[str] = set()
    cursor: str | None = None
    while True:
        params = {"limit": "250"} | ({"cursor": cursor} if cursor else {})
        response = await client.get(keys_url, params=params, headers=admin.headers)
        body = await response.json()
        await assert_ok(response)
        found |= {key["id"] for key in body["result"]}
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert found == acknowledged
    assert integrity(small_disk / "keysvc.db") == ["ok"]
