"""``keysvc serve`` with a usage retention past its bound stops at start, in one line,
rather than with a traceback or a failure at each prune."""

from pathlib import Path

from tests.server import bootstrap, free_port, keysvc


def test_serve_refuses_a_retention_past_its_bound(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    done = keysvc(
        "serve", "--db", str(db), "--port", str(free_port()),
        env={"KEYSVC_USAGE_RETENTION_DAYS": "1000000000000"},
    )  # fmt: skip
    assert (done.returncode, done.stderr.splitlines()) == (
        2,
        ["keysvc: usage-retention-days: 1000000000000 must be from 1 to 3650 days (ten years)"],
    )
