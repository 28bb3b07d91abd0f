"""The caches across real server processes: a write through one is seen at once through
another, never a stale answer."""

from pathlib import Path

from tests.server import Server, call
from tests.server import bootstrap as cli_bootstrap


def test_two_processes_never_serve_a_stale_answer(tmp_path: Path) -> None:
    """Write through one server process and check through another at once, repeatedly."""
    db = tmp_path / "shared.db"
    admin = cli_bootstrap(db)
    org = admin["organizationId"]
    with Server(db) as writer, Server(db) as reader:
        status, made = call(writer.base, f"/v1/organizations/{org}/keys", admin, "POST",
                             {"name": "svc", "roles": ["developer"]})  # fmt: skip
        assert status == 200
        svc = made["result"]
        url = f"/v1/organizations/{org}/keys/{svc['key']['id']}"
        for round_ in range(10):
            state = "disabled" if round_ % 2 == 0 else "enabled"
            assert call(reader.base, "/v1/verify", svc)[0] == (200 if state == "disabled" else 401)
            assert call(writer.base, url, admin, "PATCH", {"state": state})[0] == 200
            status, body = call(reader.base, "/v1/verify", svc)
            if state == "disabled":
                assert (status, body["error"]) == (401, "key is disabled")
            else:
                assert status == 200
        writer.stop()
        reader.stop()
