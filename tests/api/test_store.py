"""Storage through the app: no plain-text credentials in the database (or SQLite's WAL)."""

import hashlib
from pathlib import Path

from keysvc.config import Settings
from keysvc.credentials import sha256_b64
from tests.handsql import everything_stored
from tests.helpers import Client, Creds, assert_ok, create, hash_data


async def test_database_and_wal_hold_no_credentials(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """Read what is stored while the app is running (on SQLite, so that the WAL still
    has the writes)."""
    plain: list[str] = [admin.key_id, admin.secret]
    for n in range(5):
        result = await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        plain += [result["keyId"], result["keySecret"]]
    own_id, own_secret = "client-chosen-key-id-77", "client-chosen-secret-77"
    await create(
        client,
        admin,
        {"name": "own", "roles": ["developer"], "hashData": hash_data(own_id, own_secret)},
    )
    plain += [own_id, own_secret]
    url = f"/v1/organizations/{admin.organization_id}/keys/{admin.id}"
    await assert_ok(await client.get(url, headers=admin.headers))

    if settings.db_url is None:
        wal = Path(f"{settings.db_path}-wal")
        assert wal.exists() and wal.stat().st_size > 0
    blob = everything_stored(settings)
    needles: list[bytes] = []
    for value in plain:
        digest = hashlib.sha256(value.encode()).digest()
        needles += [value.encode(), digest, digest.hex().encode(), sha256_b64(value).encode()]
    assert not [n for n in needles if n in blob]
    pepper = settings.pepper or settings.pepper_path.read_bytes().strip()
    assert pepper not in blob and pepper.hex().encode() not in blob
